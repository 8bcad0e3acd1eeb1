"""The bench reads another process's CPU from its CPU-time clock, not in 10 ms ticks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

import bench_measure

# Burns CPU until its own clock has run ``WORK`` seconds, says how much it has run in
# all, then waits for its stdin to close: its clock stands still while it is read.
BURNER = """
import sys, time
work = float(sys.argv[1])
while time.process_time() < work:
    pass
print(time.process_time(), flush=True)
sys.stdin.read()
"""
# Starts a burner as its child, waits for it, then says so and waits for its stdin:
# what the child ran is counted only as a child that exited and was waited for.
PARENT = """
import subprocess, sys
child = subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]], input="",
                       capture_output=True, text=True, check=True)
print(child.stdout.strip(), flush=True)
sys.stdin.read()
"""


def started(code: str, *args: str) -> tuple[subprocess.Popen[bytes], float]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    said = float(proc.stdout.readline())
    return proc, said


def ended(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(30)


@pytest.mark.skipif(not bench_measure.cpu_clock_works(),
                    reason="no CPU-time clock of another process on this platform")
def test_a_process_cpu_is_read_to_well_under_a_tick() -> None:
    proc, own = started(BURNER, "0.137")
    try:
        read = bench_measure.process_cpu_seconds(proc.pid)
    finally:
        ended(proc)
    # What the process read of itself, give or take what it ran after saying it (its
    # print): far closer than a 10 ms tick, which would have read 0.13.
    assert own >= 0.137
    assert 0 <= read - own < 0.005, (read, own)


def test_a_process_gone_reads_zero() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    assert bench_measure.process_cpu_seconds(proc.pid) == 0.0


def test_children_that_exited_count_for_the_path() -> None:
    proc, child_own = started(PARENT, BURNER, "0.2")
    try:
        path = bench_measure.Path_("parent", "-", proc)
        with_children = path.cpu_seconds()
        alone = bench_measure.process_cpu_seconds(proc.pid)
    finally:
        ended(proc)
    # The child's CPU is known only in ticks once it was waited for: up to 10 ms of it
    # (twice rounded down, its user and its system time) may be missing.
    assert with_children - alone >= child_own - 0.02 - 1e-9, (with_children, alone, child_own)
    assert child_own >= 0.2
