"""The bench holds back free-page reporting for its run and always sets it back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

import page_reporting


def test_held_for_the_block_and_set_back(tmp_path: Path) -> None:
    knob = tmp_path / "min_free_ms"
    knob.write_text("0\n")
    with page_reporting.held_back(knob, warm_bytes=3 << 20) as said:
        assert knob.read_text() == str(page_reporting.HOLD_MS)
        assert "held back 300 s" in said and "min_free_ms 0 -> 300000" in said
        assert "3 MiB touched first" in said
    assert knob.read_text() == "0"


def test_set_back_when_the_run_fails(tmp_path: Path) -> None:
    knob = tmp_path / "min_free_ms"
    knob.write_text("250")
    with pytest.raises(RuntimeError), page_reporting.held_back(knob, warm_bytes=4096):
        raise RuntimeError("a section failed")
    assert knob.read_text() == "250"


def test_a_machine_without_the_knob_is_left_alone(tmp_path: Path) -> None:
    knob = tmp_path / "absent"
    with page_reporting.held_back(knob) as said:
        assert said == "no free-page reporting to hold back on this machine"
    assert not knob.exists()


def test_a_knob_that_refuses_the_value_is_reported(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    knob = tmp_path / "min_free_ms"
    knob.write_text("0")

    def refuse(self: Path, text: str) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "write_text", refuse)
    with page_reporting.held_back(knob) as said:
        assert said == "free-page reporting left as it was (min_free_ms 0: Permission denied)"
    assert knob.read_text() == "0"


def test_warm_writes_every_byte_of_a_size_that_is_not_whole_chunks() -> None:
    assert page_reporting.warm(10 * 4096 + 100, chunk=3 * 4096) == 10 * 4096 + 100
