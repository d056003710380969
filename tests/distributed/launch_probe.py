"""A rank of tests/distributed/test_launch.py: prints what the launcher gave it.

Arguments (any order): ``fail=R:CODE`` (rank R exits with CODE after printing),
``sleep=S`` (every other rank then sleeps S seconds and prints ``done``), ``wait-signal``
(print ``ready`` and wait for SIGTERM/SIGINT, then print ``stopped`` and exit 143).
"""

import os
import signal
import sys
import time

env = os.environ
rank = int(env.get("LAZYX_RANK", env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK", "-1"))))
names = ("LAZYX_RANK", "LAZYX_WORLD_SIZE", "LAZYX_LOCAL_RANK", "LAZYX_DIST_ADDR",
         "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
print("env " + " ".join(f"{k}={env.get(k, '-')}" for k in names), flush=True)
print(f"args {' '.join(sys.argv[1:])}", flush=True)
print(f"to stderr from {rank}", file=sys.stderr, flush=True)
options = dict(a.partition("=")[::2] for a in sys.argv[1:])
if "fail" in options:
    failing, code = map(int, options["fail"].split(":"))
    if rank == failing:
        sys.exit(code)
if "wait-signal" in options:
    def stop(signum, frame):
        print("stopped", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    time.sleep(60)
if "sleep" in options:
    time.sleep(float(options["sleep"]))
print("done", flush=True)
