"""lab/netns.py stop(): a child whose Popen's waitpid lock a Ctrl-C left held (CPython
bpo-29988) is still stopped and reaped, in bounded time (teardown's wait() would block on it)."""
from __future__ import annotations

import subprocess
import time

from drl.lab.netns import stop


def test_stop_reaps_a_child_whose_waitpid_lock_an_interrupt_left_held():
    proc = subprocess.Popen(["sleep", "30"])
    assert proc._waitpid_lock.acquire(False)        # the state an interrupted wait() can leave
    t0 = time.monotonic()
    stop(proc, timeout_s=0.3)
    assert time.monotonic() - t0 < 2.0
    assert proc.returncode == -15                   # SIGTERM, reaped by pid
    assert proc.poll() == -15


def test_stop_of_a_child_that_ignores_sigterm_kills_it():
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 30"])
    time.sleep(0.2)                                 # the trap is set
    stop(proc, timeout_s=0.3)
    assert proc.returncode == -9
