"""The CLI's default CPU threads (issue 51, item 11): with no --threads,
PACKTRAIN_THREADS or OMP_NUM_THREADS, a process uses the CPUs nothing else runs on
when it starts (runtime/distributed/cpu_share.h) — one thread beside work that keeps
every CPU busy, where OpenMP's threads would wait on each other — and a choice the
user made wins."""
import json
import os
import subprocess
import sys
import time

import pytest

CLI = os.environ.get("PACKTRAIN_BINARY")
pytestmark = pytest.mark.skipif(not CLI, reason="needs the packtrain CLI (PACKTRAIN_BINARY)")


def cpu_threads(**env):
    base = {k: v for k, v in os.environ.items() if k not in ("PACKTRAIN_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([CLI, "info", "--json"], capture_output=True, text=True, env={**base, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["cpu_threads"]


def test_one_thread_beside_work_that_fills_every_cpu():
    cpus = len(os.sched_getaffinity(0))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * cpus)]
    try:
        time.sleep(1.0)
        assert cpu_threads() == 1
        assert cpu_threads(PACKTRAIN_THREADS="2") == 2  # the user's choice wins
    finally:
        for p in busy:
            p.kill()
            p.wait()
