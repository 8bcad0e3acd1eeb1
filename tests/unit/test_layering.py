"""The sans-IO rule: codecs/ and policies/ never import trio or touch sockets."""

from __future__ import annotations

import ast
import re
import tomllib
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
NOT_IN_UNIT_TESTS = ("kproxy.embedded_broker", "kproxy.runtime.server", "socket", "fake_broker",
                     "kproxy_process", "RawClient", "confluent_kafka")


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_unit_tests_need_no_network(path: Path) -> None:
    text = path.read_text()
    found = [name for name in NOT_IN_UNIT_TESTS
             if re.search(rf"^\s*(from|import) .*\b{re.escape(name)}\b", text, re.M)]
    assert not found, f"{path.name} belongs in tests/e2e: it uses {found}"


# The I/O shell's sub-packages and the directions between them (docs/architecture.md
# draws the same map). A top-level module is a unit of its own ("cli", "context", ...).
# The sans-IO core (codecs, policies) may be imported from anywhere in the shell.
SHELL = ROOT / "proxy"
ALLOWED: dict[str, set[str]] = {
    "cli": {"commands"},
    "commands": {"config", "runtime", "supervisor", "embedded_broker", "logs"},
    "runtime": {"config", "session", "http", "metrics", "telemetry", "context", "archive",
                "memory", "logs", "embedded_broker", "auth", "supervisor"},
    "supervisor": {"config", "http", "metrics", "auth", "logs"},
    "context": {"config", "session", "runtime", "metrics", "memory"},
    "session": {"config", "metrics", "context", "archive", "memory", "logs"},
    "telemetry": {"config", "metrics", "http", "runtime", "archive", "logs"},
    "http": {"runtime", "session"},
    "metrics": {"http", "archive"},
    "config": set(),
    "auth": {"http", "logs", "config"},
    "archive": {"logs"},
    "memory": set(),
    "logs": set(),
    "embedded_broker": set(),
    "__init__": set(),
}
# Who may read the running proxy, and only as a type: the routes, the status snapshot
# and the exporter see ``kproxy.runtime.server.Proxy`` and nothing else of runtime/.
TYPE_ONLY_RUNTIME = {"http", "telemetry"}
SHELL_FILES = sorted(SHELL.rglob("*.py"))


def _unit(path: Path) -> str:
    parts = path.relative_to(SHELL).parts
    return parts[0] if len(parts) > 1 else path.stem


def _unit_of_module(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] in ("codecs", "policies", "pipeline", "__version__"):
        return None
    return parts[1]


def _shell_imports(path: Path) -> list[tuple[str, bool]]:
    """(imported kproxy module, whether it sits under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "kproxy":
            found += [(f"kproxy.{a.name}", id(node) in typing_only) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith("kproxy.")):
            found.append((node.module, id(node) in typing_only))
        elif isinstance(node, ast.Import):
            found += [(a.name, id(node) in typing_only) for a in node.names
                      if a.name.startswith("kproxy.")]
    return found


def test_every_shell_unit_has_a_rule() -> None:
    units = {_unit(p) for p in SHELL_FILES}
    assert units == set(ALLOWED), f"add a rule for {sorted(units - set(ALLOWED))}"


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shell_module_imports_only_in_allowed_directions(path: Path) -> None:
    unit = _unit(path)
    bad = set()
    for module, typing_only in _shell_imports(path):
        target = _unit_of_module(module)
        if target is None or target == unit:
            continue
        if target not in ALLOWED[unit]:
            bad.add(module)
        elif target == "runtime" and unit in TYPE_ONLY_RUNTIME and (
                module != "kproxy.runtime.server" or not typing_only):
            bad.add(f"{module} (only kproxy.runtime.server, under TYPE_CHECKING)")
    assert not bad, f"{path.relative_to(ROOT)} ({unit}) imports {sorted(bad)}"


def test_top_level_of_the_shell_stays_small() -> None:
    top = [p for p in SHELL.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 12, sorted(p.name for p in top)
    for package in (p for p in SHELL.iterdir() if (p / "__init__.py").exists()):
        modules = [m for m in package.glob("*.py") if m.name != "__init__.py"]
        assert len(modules) <= 15, f"{package.name} holds {len(modules)} modules"


@pytest.mark.parametrize("folder", ["codecs", "policies"])
def test_sans_io_top_levels_stay_small(folder: str) -> None:
    top = [p for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 20, sorted(p.name for p in top)


def test_every_package_folder_is_installed() -> None:
    """pyproject lists the packages by name: a folder missing there is left out of the
    wheel and the image (an import error at run time, not at an editable install's)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {Path(folder): name for name, folder in setuptools["package-dir"].items()}
    folders = {init.parent for root in roots for init in (ROOT / root).rglob("__init__.py")
               if ".venv" not in init.parts}
    named = set()
    for folder in folders:
        root = max((r for r in roots if folder.relative_to(ROOT).is_relative_to(r)),
                   key=lambda r: len(r.parts))
        rest = folder.relative_to(ROOT / root).parts
        named.add(".".join([roots[root], *rest]))
    assert named - set(setuptools["packages"]) == set()
