"""The coverage-guided harness that `make fuzz` runs for minutes, run here for seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HARNESS = Path(__file__).parent.parent / "fuzz" / "atheris_codecs.py"


def test_atheris_harness_runs_clean_over_every_decoder(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    result = subprocess.run([sys.executable, str(HARNESS), "-runs=20000", "-seed=1",
                             str(corpus)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Done 20000 runs" in result.stderr
    assert len(list(corpus.iterdir())) > 100, "the seed corpus was not written"
    assert not list(tmp_path.glob("crash-*"))
