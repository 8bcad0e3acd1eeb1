"""Install every matrix client into its own environment under .compat/ (idempotent).

    python tests/compat/install.py            # all clients
    python tests/compat/install.py kafkajs    # only those whose slug or driver starts so

A Python client gets a venv, an npm client an npm prefix; a finished install leaves
``.installed`` (skipped next time), a failed one ``.failed`` with the reason, which
the matrix reports instead of running the client. Only the registries are used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.compat.clients import CLIENTS, COMPAT_DIR, NODE22, Client
else:
    from .clients import CLIENTS, COMPAT_DIR, NODE22, Client

TIMEOUT = 1800


def node22_bin() -> Path:
    return COMPAT_DIR / "node22" / "node_modules" / "node" / "bin" / "node"


def node_for(client: Client) -> str:
    return str(node22_bin()) if client.node22 else (shutil.which("node") or "node")


def failure(client: Client) -> str | None:
    path = client.env_dir / ".failed"
    return path.read_text().strip() if path.exists() else None


def installed(client: Client) -> bool:
    return client.kind == "system" or (client.env_dir / ".installed").exists()


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=TIMEOUT)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines()
                 if ln.strip() and not ln.startswith("WARNING: Location")]
        if any("No matching distribution" in ln for ln in lines):
            raise RuntimeError("the registry has no wheel of this version for Python "
                               f"{sys.version_info.major}.{sys.version_info.minor}")
        errors = [ln for ln in lines if "rror" in ln] or lines
        raise RuntimeError(" | ".join(errors[-3:])[-600:])


def _install_node22() -> None:
    if node22_bin().exists():
        return
    prefix = node22_bin().parents[3]
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "package.json").write_text('{"name": "node22", "private": true}\n')
    _run(["npm", "install", "--no-audit", "--no-fund", f"node@{NODE22}"], cwd=prefix)


def _install_pypi(client: Client) -> None:
    env = client.env_dir
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
    # Wheels only: a client built here from source would link whatever library this
    # machine has, not the one that version of the client ships.
    _run([str(env / "bin" / "pip"), "install", "-q", "--only-binary", ":all:",
          f"{client.package}=={client.version}"], env={"PIP_CONSTRAINT": ""})


def _install_npm(client: Client) -> None:
    if client.node22:
        _install_node22()
    env = client.env_dir
    env.mkdir(parents=True, exist_ok=True)
    (env / "package.json").write_text(json.dumps({"name": client.slug.lower(), "private": True,
                                                  "type": "module"}) + "\n")
    extra = {}
    if client.build_from_source:
        # Its install step would fetch a prebuilt binary from outside the registries;
        # build it and its bundled librdkafka against the local Node's headers instead.
        # Its default static link downloads zlib, OpenSSL, zstd and curl sources from
        # their own sites (unreachable here): link those from Debian's packages.
        extra = {"npm_config_build_from_source": "true", "CKJS_LINKING": "dynamic"}
    _run(["npm", "install", "--no-audit", "--no-fund", f"{client.package}@{client.version}"],
         cwd=env, env=extra)


def install(client: Client) -> str:
    if installed(client):
        return "present"
    env = client.env_dir
    if env.exists():
        shutil.rmtree(env)
    env.mkdir(parents=True)
    try:
        (_install_pypi if client.kind == "pypi" else _install_npm)(client)
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        (env / ".failed").write_text(str(exc) + "\n")
        return f"FAILED: {exc}"
    (env / ".installed").write_text(f"{client.package}@{client.version}\n")
    return "installed"


def main(argv: list[str]) -> int:
    wanted = [c for c in CLIENTS if not argv or any(
        c.slug.startswith(a) or c.driver.startswith(a) for a in argv)]
    failed = 0
    for client in wanted:
        if client.kind == "system":
            continue
        result = install(client)
        failed += result.startswith("FAILED")
        print(f"{client.name} {client.version}: {result}", flush=True)
    return 0 if not argv or not failed else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
