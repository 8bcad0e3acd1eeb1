"""The bench holds back free-page reporting for its run and always sets it back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

import page_reporting


def knobs(tmp_path: Path, **values: str) -> Path:
    for name, value in values.items():
        (tmp_path / name).write_text(value)
    return tmp_path


def test_held_for_the_block_and_set_back(tmp_path: Path) -> None:
    where = knobs(tmp_path, min_free_ms="0\n", max_waiting_mib="1024\n")
    with page_reporting.held_back(where, warm_bytes=3 << 20) as said:
        assert (where / "min_free_ms").read_text() == "300000"
        assert (where / "max_waiting_mib").read_text() == "16384"
        assert said == ("free-page reporting held back for the run (min_free_ms 0 -> "
                        "300000, max_waiting_mib 1024 -> 16384, set back after), 3 MiB "
                        "touched first; see tests/bench/page_reporting.py")
    assert (where / "min_free_ms").read_text() == "0"
    assert (where / "max_waiting_mib").read_text() == "1024"


def test_set_back_when_the_run_fails(tmp_path: Path) -> None:
    where = knobs(tmp_path, min_free_ms="250", max_waiting_mib="512")
    with pytest.raises(RuntimeError), page_reporting.held_back(where, warm_bytes=4096):
        raise RuntimeError("a section failed")
    assert (where / "min_free_ms").read_text() == "250"
    assert (where / "max_waiting_mib").read_text() == "512"


def test_a_machine_without_the_knobs_is_left_alone(tmp_path: Path) -> None:
    where = knobs(tmp_path, min_free_ms="0")  # one of the two only: an older kernel
    with page_reporting.held_back(where) as said:
        assert said == "no free-page reporting to hold back on this machine"
    assert (where / "min_free_ms").read_text() == "0"
    assert not (where / "max_waiting_mib").exists()


def test_a_knob_that_refuses_its_value_is_reported_and_the_others_set_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = knobs(tmp_path, min_free_ms="0", max_waiting_mib="1024")
    write_text = Path.write_text

    def refuse_the_second(self: Path, text: str) -> int:
        if self.name == "max_waiting_mib":
            raise PermissionError(13, "Permission denied")
        return write_text(self, text)

    monkeypatch.setattr(Path, "write_text", refuse_the_second)
    with page_reporting.held_back(where, warm_bytes=4096) as said:
        assert said == ("free-page reporting left as it was (max_waiting_mib 1024: "
                        "Permission denied)")
    assert (where / "min_free_ms").read_text() == "0"
    assert (where / "max_waiting_mib").read_text() == "1024"


def test_warm_writes_every_byte_of_a_size_that_is_not_whole_chunks() -> None:
    assert page_reporting.warm(10 * 4096 + 100, chunk=3 * 4096) == 10 * 4096 + 100
