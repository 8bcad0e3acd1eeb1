"""Run the whole suite while CPU hogs keep every core busy (make test-loaded).

CI runs on a busy machine, so a test whose verdict depends on load is a defect. This
starts one busy-looping process per core (each ends by itself after --hog-seconds,
and all are killed when the runs end), then runs pytest --runs times in a row and
prints one line per run and a summary. Exit status is non-zero if any run failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOG = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def start_hogs(count: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", HOG.format(seconds=seconds)])
            for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="suite runs in a row")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2,
                        help="busy-looping processes (default: one per core)")
    parser.add_argument("--hog-seconds", type=float, default=3 * 3600,
                        help="each hog ends by itself after this long")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (default: -q)")
    args = parser.parse_args()
    results: list[tuple[int, int, float]] = []
    # Stopped (make interrupted, a CI timeout): end the hogs too, not only on return.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hogs = start_hogs(args.hogs, args.hog_seconds)
    try:
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            code = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                    *(args.pytest_args or ["-q"])], cwd=ROOT)
            took = time.monotonic() - started
            results.append((run, code, took))
            print(f"loaded run {run}/{args.runs}: exit {code} in {took:.0f}s "
                  f"with {args.hogs} CPU hogs", flush=True)
    finally:
        stop_hogs(hogs)
    failed = [r for r in results if r[1] != 0]
    print(f"loaded runs: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
