"""Telemetry pushes per CPU-second: this tree against a baseline commit, side by side.

The installed package maps kproxy=proxy/, kproxy.codecs=codecs/ and so on
(pyproject's package-dir), so a checkout of another commit cannot simply be put on
the path. The baseline's tree is exported with ``git archive`` (the archive carries
its commit id, read back with ``git get-tar-commit-id``) and laid out as its own
pyproject says, with symlinks, in a folder put first on PYTHONPATH: the editable
install of this tree is a finder Python consults only after the path, so the
baseline's modules win. Both proxies start through the same launcher, which writes
the file it imported kproxy from into the process's log before it runs: the report
quotes those lines as the proof of which code ran.

Both proxies run at once, with the same flags, in front of one broker; the rounds
alternate which one is measured first, and the ratio is taken per round.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_measure import Path_, start, telemetry_pushes
from bench_stats import fmt

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kproxy.embedded_broker import TansuBroker, free_port  # noqa: E402
from tests.support import stop_process  # noqa: E402

BASELINE = "d1cc828"
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


def launch(name: str, broker: str, work: Path, site: Path | None,
           extra: list[str]) -> tuple[Path_, str]:
    """A proxy started through the launcher, and the import line it wrote."""
    port, http, base = free_port(), free_port(), free_port()
    log = work / f"kproxy-telemetry-{name}.log"
    env = {"KPROXY_CONFIG": ""}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = start([sys.executable, "-c", LAUNCHER, "run", *extra, "--upstream", broker,
                  "--listen", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http}",
                  "--broker-port-base", str(base), "--node-id-range", "111-111",
                  "--telemetry-default-interval-ms", "100", "--log-level", "warning"],
                 port, log, env, cwd=work)
    line = next((ln for ln in log.read_text().splitlines() if ln.startswith(IMPORTED)), "")
    return Path_(name, f"127.0.0.1:{port}", proc), line


def measure(work: Path, rounds: int, seconds: float, instances: int,
            baseline: str = BASELINE) -> dict[str, Any]:
    """Per side, one telemetry_pushes result per round; the proof of what ran."""
    out: dict[str, Any] = {"baseline": baseline, "current": [], "base": []}
    folder = work / "telemetry-baseline"
    try:
        full, src = export(baseline, folder)
    except (subprocess.CalledProcessError, OSError, KeyError) as exc:
        err = exc.stderr.decode() if isinstance(exc, subprocess.CalledProcessError) else exc
        out["error"] = f"could not export {baseline}: {str(err).strip()[:300]}"
        return out
    out.update(baseline_commit=full, current_commit=this_tree())
    sides: list[Path_] = []
    with TansuBroker(log_path=work / "broker-telemetry.log") as broker:
        try:
            current, out["current_import"] = launch("current", broker.bootstrap, work, None,
                                                    ["--workers", "1"])
            sides.append(current)
            base, out["base_import"] = launch("base", broker.bootstrap, work,
                                              folder / "site", [])
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
                    result = telemetry_pushes(side.bootstrap, side, seconds, instances)
                    out[side.name].append(result)
                    print(f"telemetry round {r + 1}/{rounds} {side.name:8} "
                          f"{result['pushes_per_cpu_s']:,.0f} pushes per CPU-second",
                          flush=True)
        finally:
            for side in sides:
                if side.process is not None:
                    stop_process(side.process)
    return out


def ratios(data: dict[str, Any] | None) -> list[float]:
    """This tree over the baseline, pushes per CPU-second, per round."""
    if not data:
        return []
    return [c["pushes_per_cpu_s"] / b["pushes_per_cpu_s"]
            for c, b in zip(data.get("current", []), data.get("base", []), strict=False)
            if b["pushes_per_cpu_s"]]


def summary(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each field's median over the rounds (refusals: their sum)."""
    if not rounds:
        return {}
    out = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    out["refused"] = sum(r["refused"] for r in rounds)
    return out


def section(data: dict[str, Any] | None, legacy: dict[str, float] | None) -> list[str]:
    lines = ["## Telemetry termination", ""]
    if not data or data.get("error") or not data.get("current"):
        if legacy:  # a run from before the side-by-side comparison
            lines += [f"- kproxy: {legacy['pushes_s']:,.0f} accepted PushTelemetry/s, "
                      f"{legacy['pushes_per_cpu_s']:,.0f} pushes per CPU-second "
                      f"({legacy['refused']:.0f} refused)"]
        if data and data.get("error"):
            lines += [f"- baseline not measured: {data['error']}"]
        return [*lines, ""]
    rows = [("this tree (" + data["current_commit"] + ")", summary(data["current"])),
            (data["baseline_commit"][:7], summary(data["base"]))]
    lines += ["| kproxy | accepted pushes/s | pushes per CPU-second | share of a core | "
              "refused |", "|---|---|---|---|---|"]
    for name, s in rows:
        lines.append(f"| {name} | {s['pushes_s']:,.0f} | {s['pushes_per_cpu_s']:,.0f} | "
                     f"{100 * s['proxy_cpu']:.0f}% | {s['refused']:.0f} |")
    r = ratios(data)
    lines += ["", f"This tree / {data['baseline_commit'][:7]}, pushes per CPU-second, the "
              f"median of {len(r)} paired round(s): **{fmt(statistics.median(r), 2)}**. "
              "Both proxies ran at once with the same flags (one process each, a 100 ms "
              "push interval) and one broker; each round sends PushTelemetry with real "
              "librdkafka zstd payloads from freshly subscribed instances over four "
              "connections, decoded into the live Prometheus exporter; the rounds "
              "alternate which proxy goes first.", "",
              f"The baseline is the tree of commit `{data['baseline_commit']}` "
              "(`git archive`, its id read back with `git get-tar-commit-id`), laid out by "
              "its own pyproject and put first on PYTHONPATH. Each process wrote what it "
              "imported before it started:", "",
              f"- this tree: `{data['current_import']}`",
              f"- baseline: `{data['base_import']}`", ""]
    return lines
