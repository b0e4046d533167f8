"""Memory containment on real processes: the watchdog kills a process tree that grows past its
limit, RLIMIT_AS makes allocations fail, and a cgroup (where this machine lets us make one)
kills the whole sandbox; each says which limit and how much was resident."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from kernelabd.harness.containment import (
    RlimitGuard,
    WatchdogGuard,
    cgroup_offered,
    descendants,
    guard_for,
    resident,
)

MIB = 1 << 20
# Grows by 32 MiB of touched pages every 20 ms, in a child process (the tree is what counts).
GROWER = """
import os, time
if os.fork() == 0:
    held = []
    for _ in range(200):
        held.append(bytearray(32 << 20))
        time.sleep(0.02)
    time.sleep(60)
    os._exit(0)
os.wait()
"""


def test_the_watchdog_kills_a_process_tree_that_outgrows_its_limit() -> None:
    proc = subprocess.Popen([sys.executable, "-c", GROWER], start_new_session=True)
    guard = WatchdogGuard(256 * MIB, "candidate")
    guard.started(proc.pid, lambda: os.killpg(proc.pid, signal.SIGKILL))
    try:
        deadline = time.monotonic() + 30
        while guard.breach("") is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        guard.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    reason = guard.breach("")
    assert reason is not None and "memory limit of 256 MiB" in reason
    held = float(reason.rsplit("(", 1)[1].split()[0])
    assert held >= 256, f"what was resident when killed: {reason}"


def test_resident_memory_counts_every_process_below_the_sandbox() -> None:
    proc = subprocess.Popen([sys.executable, "-c", GROWER.replace("range(200)", "range(4)")],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(descendants(proc.pid)) < 2 or resident(proc.pid) < 128 * MIB:
            assert time.monotonic() < deadline, "the child never grew"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_rlimit_as_makes_allocations_fail_and_names_the_limit() -> None:
    guard = RlimitGuard(1 << 30, "candidate")
    done = subprocess.run([sys.executable, "-c", "bytearray(4 << 30)"], preexec_fn=guard.preexec,
                          capture_output=True, text=True)
    assert done.returncode != 0 and "MemoryError" in done.stderr
    assert guard.breach(done.stderr) == "ran out of its memory limit of 1.0 GiB of address space"
    assert guard.breach("ZeroDivisionError: division by zero") is None, "only out-of-memory is a breach"


def test_no_limit_is_no_guard() -> None:
    guard = guard_for(0, "cpu", "candidate")
    assert guard.mode == "none" and guard.breach("MemoryError") is None


@pytest.mark.skipif(cgroup_offered() is None, reason="this process may not make cgroups here")
def test_a_cgroup_kills_the_whole_sandbox_at_its_limit() -> None:
    from kernelabd.harness.sandbox import Sandbox, SandboxError, SandboxSpec
    from tests.harness.test_sandbox import run_inside

    with Sandbox(SandboxSpec(label="hungry", memory_bytes=512 * MIB)) as box:
        assert box._guard.mode == "cgroup"
        with pytest.raises(SandboxError) as caught:
            run_inside(box, "held = [bytearray(64 << 20) for _ in range(64)]\n")
    assert caught.value.kind == "memory" and "memory limit of 512 MiB" in caught.value.message
