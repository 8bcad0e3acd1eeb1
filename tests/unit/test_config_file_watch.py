"""The config watch compares the file with what the last reload read, whatever started
that reload (SIGHUP, the watch itself, an admin call): an edit then signalled is read
once. Seen at 2 workers: SIGHUP loaded the edit, then each worker's watch loaded it again,
and the status page showed config generation 2 for one reload."""

from __future__ import annotations

from pathlib import Path

from kproxy.runtime.lifecycle import ConfigFile


def test_an_edit_read_by_a_signalled_reload_is_not_a_change(tmp_path: Path) -> None:
    path = tmp_path / "kproxy.toml"
    path.write_text("a = 1\n")
    file = ConfigFile(str(path))
    assert not file.changed()
    path.write_text("a = 2\n")
    assert file.changed()
    file.reading()  # SIGHUP's reload reads the edit
    assert not file.changed()
    path.write_text("a = 3\n")  # an edit after that read is the watch's again
    assert file.changed()


def test_a_rejected_file_is_not_retried_until_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "kproxy.toml"
    path.write_text("a = 1\n")
    file = ConfigFile(str(path))
    path.write_text("not toml [")
    file.reading()
    assert not file.changed()
    path.write_text("a = 4\n")
    assert file.changed()


def test_a_missing_file_then_a_new_one_is_a_change(tmp_path: Path) -> None:
    path = tmp_path / "kproxy.toml"
    path.write_text("a = 1\n")
    file = ConfigFile(str(path))
    path.unlink()  # a ConfigMap update swaps its symlink: for a moment there is none
    assert file.changed()
    file.reading()
    assert not file.changed()
    path.write_text("a = 1\n")
    assert file.changed()
