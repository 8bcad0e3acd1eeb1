"""A proxy of this tree against one of a baseline commit, side by side in one run.

The installed package maps kproxy=proxy/, kproxy.codecs=codecs/ and so on
(pyproject's package-dir), so a checkout of another commit cannot simply be put on
the path. The baseline's tree is exported with ``git archive`` (the archive carries
its commit id, read back with ``git get-tar-commit-id``) and laid out as its own
pyproject says, with symlinks, in a folder put first on PYTHONPATH: the editable
install of this tree is a finder Python consults only after the path, so the
baseline's modules win. Both proxies start through the same launcher, which writes
the file it imported kproxy from into the process's log before it runs: the report
quotes those lines as the proof of which code ran.

Both proxies run at once, with the same flags, in front of one broker, each as one
process: ``--workers 1`` for this tree and for a baseline that knows the flag (one
that does not runs one process anyway); the rounds shuffle which one is measured
first, and ratios are taken per round.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_measure import Path_, start

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port  # noqa: E402
from tests.support import broker_port_base, stop_process  # noqa: E402

IMPORTED = "kproxy imported from"
LAUNCHER = ("import os, sys, kproxy, kproxy.codecs, kproxy.cli; "
            f"print({IMPORTED!r}, os.path.realpath(kproxy.__file__), 'and', "
            "os.path.realpath(kproxy.codecs.__file__), flush=True); "
            "sys.exit(kproxy.cli.main())")


def git(*args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], input=data, capture_output=True,
                          check=True).stdout


def export(commit: str, dest: Path) -> tuple[str, Path]:
    """The commit's tree in ``dest/src``, importable from ``dest/site``; its full id."""
    src, site = dest / "src", dest / "site"
    src.mkdir(parents=True)
    archive = git("archive", "--format=tar", commit)
    full = git("get-tar-commit-id", data=archive).decode().strip()
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pyproject = tomllib.loads((src / "pyproject.toml").read_text())
    mapping: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    for package in sorted(mapping, key=lambda name: name.count(".")):
        target = site.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for child in (src / mapping[package]).iterdir():
            if f"{package}.{child.name}" not in mapping and child.name != "__pycache__":
                (target / child.name).symlink_to(child)
    return full, src


def this_tree() -> str:
    head = git("rev-parse", "--short", "HEAD").decode().strip()
    dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    return head + (" with uncommitted changes" if dirty else "")


def proxy_env(site: Path | None) -> dict[str, str]:
    """What a proxy's process adds to the environment: no config file, and the tree
    importable from ``site`` first on the path (None: this tree's)."""
    env = {"KPROXY_CONFIG": ""}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def launch(name: str, broker: str, work: Path, site: Path | None, extra: list[str],
           tag: str) -> tuple[Path_, str]:
    """A proxy started through the launcher, and the import line it wrote."""
    port, http, base = free_port(), free_port(), broker_port_base()
    log = work / f"kproxy-{tag}-{name}.log"
    proc = start([sys.executable, "-c", LAUNCHER, "run", *extra, "--upstream", broker,
                  "--listen", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http}",
                  "--broker-port-base", str(base), "--node-id-range", "111-111",
                  "--telemetry-default-interval-ms", "100", "--log-level", "warning"],
                 port, log, proxy_env(site), cwd=work)
    line = next((ln for ln in log.read_text().splitlines() if ln.startswith(IMPORTED)), "")
    return Path_(name, f"127.0.0.1:{port}", proc), line


def one_process(site: Path) -> list[str]:
    """``--workers 1`` if the baseline importable from ``site`` knows the flag, else
    nothing: without it, a proxy that knows it starts one worker per core, and the
    comparison with this tree's one process would measure the worker count."""
    usage = subprocess.run([sys.executable, "-c", LAUNCHER, "run", "--help"],
                           env={**os.environ, **proxy_env(site)},
                           capture_output=True, text=True, timeout=60, check=False).stdout
    return ["--workers", "1"] if "--workers" in usage else []


def side_by_side(work: Path, tag: str, baseline: str, rounds: int,
                 one_round: Callable[[Path_], dict[str, float]],
                 out: dict[str, Any]) -> dict[str, Any]:
    """``one_round`` through each side per round, into ``out["current"]`` and
    ``out["base"]``; with the commits and the proof of what ran (or an error)."""
    out.update(baseline=baseline, current=[], base=[])
    folder = work / f"{tag}-baseline"
    try:
        full, src = export(baseline, folder)
    except (subprocess.CalledProcessError, OSError, KeyError) as exc:
        err = exc.stderr.decode() if isinstance(exc, subprocess.CalledProcessError) else exc
        out["error"] = f"could not export {baseline}: {str(err).strip()[:300]}"
        return out
    out.update(baseline_commit=full, current_commit=this_tree())
    sides: list[Path_] = []
    with TansuBroker(log_path=work / f"broker-{tag}.log") as broker:
        try:
            current, out["current_import"] = launch("current", broker.bootstrap, work, None,
                                                    ["--workers", "1"], tag)
            sides.append(current)
            base, out["base_import"] = launch("base", broker.bootstrap, work,
                                              folder / "site", one_process(folder / "site"),
                                              tag)
            sides.append(base)
            if (str(src.resolve()) not in out["base_import"]
                    or str(ROOT) not in out["current_import"]):
                raise RuntimeError(f"not the code meant: {out['current_import']!r}, "
                                   f"{out['base_import']!r}")
            rnd = random.Random(3)
            for r in range(rounds):
                order = [current, base]
                rnd.shuffle(order)
                for side in order:
                    result = one_round(side)
                    out[side.name].append(result)
                    print(f"{tag} round {r + 1}/{rounds} {side.name:8} " + ", ".join(
                        f"{k} {v:,.2f}" for k, v in result.items()), flush=True)
        finally:
            for side in sides:
                if side.process is not None:
                    stop_process(side.process)
    return out
