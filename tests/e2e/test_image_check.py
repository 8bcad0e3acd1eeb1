"""deploy/image_check.py end to end: a bare-venv install of the package, then a smoke
run of `kproxy run` in front of a real tansu broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_image_check_runtime_install_and_smoke() -> None:
    from kproxy.embedded_broker import tansu_binary

    proc = subprocess.run([sys.executable, str(ROOT / "deploy" / "image_check.py"),
                           "--broker-bin", tansu_binary()], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "runtime install OK" in proc.stdout
