"""`make image`: build the container image with Docker when an engine answers, else buildah.

Without a Docker engine the build runs through Debian's buildah (storage driver vfs,
isolation chroot: no daemon, no nested namespaces needed). The Dockerfile's base,
debian:bookworm-slim, is used as found in local storage; else pulled; else, with no
registry in reach, made from Debian's packages with `debootstrap --variant=minbase
bookworm` from the mirror this host's apt uses, and committed locally under the base's
own name, so the Dockerfile builds unchanged.

The build steps reach the package indexes only through what this host trusts and is
configured with: its CA bundle and its apt and pip configuration are bind-mounted
read-only into each RUN step and never land in a layer.

The image is tagged `kproxy:<hash of its inputs>` as well as the requested tag; when an
image with the current hash exists, nothing is rebuilt.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = "docker.io/library/debian:bookworm-slim"
REPO = "localhost/kproxy"
INPUT_FILES = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md")
INPUT_DIRS = ("proxy", "codecs", "policies", "pipeline")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Where the build sees the host's CA bundle: not at Debian's path, where the build's own
# ca-certificates package (pulled in by python3-venv) must be able to write its bundle.
BUILD_CA = "/run/kproxy-build-ca.crt"
# buildah and podman share containers-storage: every call names the same driver.
STORAGE = ["--storage-driver", "vfs"]
ENV = {**os.environ, "STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}


def say(msg: str) -> None:
    print(f"image: {msg}", flush=True)


def inputs_hash(root: Path = ROOT) -> str:
    """Hash of everything the Dockerfile reads: a change to any of it means a rebuild."""
    digest = hashlib.sha256()
    files = [root / f for f in INPUT_FILES]
    for d in INPUT_DIRS:
        files += sorted(p for p in (root / d).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def run(cmd: list[str], timeout: float | None = None, quiet: bool = False
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=ENV, text=True, timeout=timeout, check=False,
                          capture_output=quiet)


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return run(["docker", "info"], timeout=30, quiet=True).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def buildah(*args: str, timeout: float | None = None, quiet: bool = True
            ) -> subprocess.CompletedProcess[str]:
    return run(["buildah", *STORAGE, *args], timeout=timeout, quiet=quiet)


def image_exists(name: str) -> bool:
    return buildah("inspect", "--type", "image", name).returncode == 0


def image_size(name: str) -> str:
    """The image's size as `buildah images` reports it (all layers, uncompressed)."""
    listed = json.loads(buildah("images", "--json", name).stdout or "[]")
    return str(listed[0]["size"]) if listed else "unknown"


# ------------------------------------------------------------------ the base image


def host_debian_mirror() -> str:
    """The Debian archive URI this host's apt reads bookworm from (deb822 or one-line)."""
    apt = Path("/etc/apt")
    for path in sorted(apt.glob("sources.list.d/*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            if "bookworm" in fields.get("Suites", "").split() and \
                    fields.get("Types", "deb").split()[0] == "deb":
                return fields["URIs"].split()[0]
    for path in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        if path.exists():
            for line in path.read_text().splitlines():
                m = re.match(r"deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", line)
                if m:
                    return m.group(1)
    raise SystemExit("image: no bookworm source in /etc/apt/sources.list*: cannot debootstrap")


# Debian's slim images leave documentation, manuals and translations out; so does ours.
DPKG_EXCLUDES = """\
# Written by kproxy's deploy/image_build.py: keep the base small, as a slim image is.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
"""


def make_base() -> None:
    if shutil.which("debootstrap") is None:
        raise SystemExit("image: debootstrap is missing (make image installs it)")
    mirror = host_debian_mirror()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="kproxy-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        say("no registry in reach: making debian:bookworm-slim with debootstrap (minbase)")
        proc = run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror],
                   timeout=1800, quiet=True)
        if proc.returncode:
            raise SystemExit("image: debootstrap failed:\n" + (proc.stdout + proc.stderr)[-2000:])
        (rootfs / "etc/dpkg/dpkg.cfg.d/slim").write_text(DPKG_EXCLUDES)
        for pattern in ("usr/share/doc/*/[!c]*", "usr/share/man/*", "usr/share/info/*",
                        "usr/share/locale/*", "var/cache/apt/*", "var/lib/apt/lists/*",
                        "var/log/*", "var/cache/debconf/*-old", "var/lib/dpkg/*-old"):
            for p in rootfs.glob(pattern):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        # The sources debootstrap wrote name the mirror it read from: builds bring their
        # own (this host's, mounted), so the base names none.
        (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "--exclude=./dev/*",
                        "--exclude=./proc/*", "--exclude=./sys/*", "-cf", str(tarball), "."],
                       check=True)
        ctr = buildah("from", "scratch").stdout.strip()
        try:
            for step in (["add", ctr, str(tarball), "/"],
                         ["config", "--cmd", "bash", "--env",
                          "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                          "--os", "linux", "--arch", "amd64", ctr],
                         ["commit", "--quiet", "--format", "docker", ctr, BASE]):
                proc = buildah(*step)
                if proc.returncode:
                    raise SystemExit(f"image: buildah {step[0]} failed: {proc.stderr}")
        finally:
            buildah("rm", ctr)
    say(f"made {BASE} from Debian packages in {time.monotonic() - started:.0f} s")


def ensure_base() -> None:
    if image_exists(BASE):
        return
    try:
        pulled = buildah("pull", "--quiet", BASE, timeout=120)
        if pulled.returncode == 0:
            return
    except subprocess.TimeoutExpired:
        pass
    make_base()


# ------------------------------------------------------------------ host configuration


def pip_settings_from_env() -> dict[str, str]:
    """PIP_* variables as pip.conf [global] keys (PIP_FIND_LINKS -> find-links)."""
    return {k[4:].lower().replace("_", "-"): v for k, v in os.environ.items()
            if k.startswith("PIP_") and k != "PIP_CONFIG_FILE"}


def local_paths(values: list[str]) -> set[str]:
    """Local files and folders a pip setting points at (find-links, file:// indexes)."""
    out = set()
    for value in values:
        for word in value.split():
            path = word
            if word.startswith("file://"):
                # A local index's pages link to files beside its simple/ folder.
                path = os.path.dirname(word[len("file://"):].rstrip("/"))
            if path.startswith("/") and os.path.exists(path):
                out.add(os.path.realpath(path) if os.path.isfile(path) else path.rstrip("/"))
    return out


def host_mounts(scratch: Path) -> list[str]:
    """-v options: the host's CA bundle, apt and pip configuration, read-only."""
    mounts: dict[str, str] = {}
    if os.path.exists(CA_BUNDLE):
        mounts[CA_BUNDLE] = BUILD_CA
    for path in ("/etc/apt/sources.list", "/etc/apt/sources.list.d",
                 "/etc/apt/apt.conf.d", "/etc/apt/trusted.gpg.d", "/etc/xdg/pip"):
        if os.path.exists(path):
            mounts[path] = path
    user_pip = Path.home() / ".config" / "pip"
    if user_pip.is_dir():
        mounts[str(user_pip)] = "/root/.config/pip"
    # /etc/pip.conf with the PIP_* environment merged in: pip in the build reads it as
    # the host's pip would read both.
    merged = configparser.ConfigParser(interpolation=None)
    files = [Path("/etc/pip.conf"), *Path("/etc/xdg/pip").glob("*.conf"),
             *user_pip.glob("*.conf")]
    for f in files:
        if f.is_file():
            merged.read(f)
    global_pip = configparser.ConfigParser(interpolation=None)
    if Path("/etc/pip.conf").is_file():
        global_pip.read("/etc/pip.conf")
    if not global_pip.has_section("global"):
        global_pip.add_section("global")
    for key, value in pip_settings_from_env().items():
        global_pip.set("global", key, value)
    if CA_BUNDLE in mounts:
        global_pip.set("global", "cert", BUILD_CA)
    conf = scratch / "pip.conf"
    with conf.open("w") as out:
        global_pip.write(out)
    mounts[str(conf)] = "/etc/pip.conf"
    values = [v for c in (merged, global_pip) for s in c.sections() for _, v in c.items(s)]
    for path in local_paths(values):
        mounts.setdefault(path, path)
    return [f"--volume={src}:{dst}:ro" for src, dst in sorted(mounts.items())]


# ------------------------------------------------------------------ building


def build_with_docker(tag: str) -> None:
    say(f"building {tag} with docker")
    proc = run(["docker", "build", "-t", tag, str(ROOT)])
    if proc.returncode:
        raise SystemExit(proc.returncode)


def build_with_buildah(tag: str) -> str:
    """Build (unless the inputs' image exists) and return the hash-tagged name."""
    if shutil.which("buildah") is None:
        raise SystemExit("image: no Docker engine answers and buildah is missing "
                         "(make image installs it)")
    hashed = f"{REPO}:{inputs_hash()}"
    if image_exists(hashed):
        say(f"{hashed} is up to date (its inputs are unchanged); not rebuilt")
    else:
        ensure_base()
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="kproxy-build-") as scratch:
            cmd = ["buildah", *STORAGE, "bud", "--format", "docker", "--isolation", "chroot",
                   "--layers", "--pull=false", *host_mounts(Path(scratch)), "-t", hashed,
                   "-f", str(ROOT / "Dockerfile"), str(ROOT)]
            proc = run(cmd)
        if proc.returncode:
            raise SystemExit(f"image: buildah bud failed ({proc.returncode})")
        say(f"built {hashed} in {time.monotonic() - started:.0f} s")
    if tag != hashed:
        buildah("tag", hashed, tag)
    say(f"{tag}: {image_size(hashed)}")
    return hashed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default=f"{REPO}:latest")
    parser.add_argument("--engine", choices=("auto", "docker", "buildah"), default="auto")
    args = parser.parse_args()
    engine = args.engine
    if engine == "auto":
        engine = "docker" if docker_answers() else "buildah"
        if engine == "buildah":
            say("no Docker engine answers (docker info); building with buildah")
    if engine == "docker":
        build_with_docker(args.tag)
    else:
        build_with_buildah(args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
