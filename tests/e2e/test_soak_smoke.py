"""`make soak` runs for ten minutes; this runs the same script for half a minute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).parent.parent / "soak" / "run_soak.py"


def test_short_soak_loses_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    result = subprocess.run([sys.executable, str(SOAK), "--seconds", "25", "--rate", "300",
                             "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["failures"] == []
    assert summary["produced_acked"] > 1000 and summary["lost"] == 0
    assert summary["churn_connections"] > 10 and summary["telemetry_pushes"] > 0
    assert len(summary["samples"]) >= 8
