"""The sans-IO rule: codecs/ and policies/ never import trio or touch sockets."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"trio", "socket", "asyncio", "selectors", "ssl", "h11", "subprocess"}
SANS_IO = sorted([*(ROOT / "codecs").rglob("*.py"), *(ROOT / "policies").rglob("*.py")])


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_there_is_something_to_check() -> None:
    assert len(SANS_IO) >= 10


@pytest.mark.parametrize("path", SANS_IO, ids=lambda p: str(p.relative_to(ROOT)))
def test_sans_io_module_imports_no_io(path: Path) -> None:
    bad = _imports(path) & FORBIDDEN
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def _kproxy_modules(path: Path) -> set[str]:
    """The kproxy modules a file imports, by their full dotted names."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("kproxy"))
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith("kproxy")):
            names.add(node.module)
    return names


# What the sans-IO layers may import from the package: themselves, never the I/O shell.
SANS_IO_PACKAGES = ("kproxy.codecs", "kproxy.policies")


@pytest.mark.parametrize("path", SANS_IO, ids=lambda p: str(p.relative_to(ROOT)))
def test_sans_io_module_imports_no_proxy_module(path: Path) -> None:
    bad = {m for m in _kproxy_modules(path) if not m.startswith(SANS_IO_PACKAGES)}
    assert not bad, f"{path.relative_to(ROOT)} imports the I/O layer: {sorted(bad)}"


@pytest.mark.parametrize("path", sorted((ROOT / "codecs").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_codecs_import_no_policy(path: Path) -> None:
    bad = {m for m in _kproxy_modules(path) if m.startswith("kproxy.policies")}
    assert not bad, f"{path.relative_to(ROOT)} imports policies: {sorted(bad)}"


UNIT_TESTS = sorted((ROOT / "tests" / "unit").glob("test_*.py"))
# What would make a unit test start a broker, a proxy or a socket.
NOT_IN_UNIT_TESTS = ("kproxy.embedded_broker", "kproxy.server", "socket", "fake_broker",
                     "kproxy_process", "RawClient", "confluent_kafka")


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_unit_tests_need_no_network(path: Path) -> None:
    text = path.read_text()
    found = [name for name in NOT_IN_UNIT_TESTS
             if re.search(rf"^\s*(from|import) .*\b{re.escape(name)}\b", text, re.M)]
    assert not found, f"{path.name} belongs in tests/e2e: it uses {found}"
