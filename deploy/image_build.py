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
import io
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
# Where the pip step sees the host's CA bundle (a build secret): not at Debian's path,
# where the build's own ca-certificates package writes its bundle.
BUILD_CA = "/run/secrets/kproxy-ca"
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
    """PIP_* variables as pip.conf keys (PIP_FIND_LINKS -> find-links)."""
    return {k[4:].lower().replace("_", "-"): v for k, v in os.environ.items()
            if k.startswith("PIP_") and k != "PIP_CONFIG_FILE"}


def is_local(word: str) -> bool:
    return word.startswith(("file:", "/", "./", "~"))


def pip_config() -> str:
    """This host's pip configuration, as one file for the build's pip.

    Read like pip reads it: global files, then the user's, then PIP_* variables, later
    ones winning. What points at this host's disk (local indexes, find-links folders,
    constraint files) is left out: the build has none of it and reaches the index over
    the network, trusting what this host trusts (the CA bundle, mounted beside it).
    """
    merged: dict[str, dict[str, str]] = {}
    files = [Path("/etc/xdg/pip/pip.conf"), Path("/etc/pip.conf"),
             Path.home() / ".pip" / "pip.conf", Path.home() / ".config" / "pip" / "pip.conf"]
    for path in files:
        parser = configparser.ConfigParser(interpolation=None)
        if path.is_file():
            parser.read(path)
        for section in parser.sections():
            merged.setdefault(section, {}).update(parser.items(section))
    merged.setdefault("global", {}).update(pip_settings_from_env())
    out = configparser.ConfigParser(interpolation=None)
    for section, items in merged.items():
        out.add_section(section)
        for key, value in items.items():
            if key in ("cert", "client-cert"):
                continue
            kept = [w for w in value.split() if not is_local(w)]
            if kept:
                out.set(section, key, " ".join(kept))
    out.set("global", "cert", BUILD_CA)
    buf = io.StringIO()
    out.write(buf)
    return buf.getvalue()


def build_secrets(scratch: Path) -> list[str]:
    """--secret options: the CA bundle and the pip configuration, for the pip step only."""
    conf = scratch / "pip.conf"
    conf.write_text(pip_config())
    return [f"--secret=id=kproxy-ca,src={CA_BUNDLE}", f"--secret=id=kproxy-pip,src={conf}"]


def apt_volumes() -> list[str]:
    """-v options: this host's apt sources and settings, read-only, for the apt steps.

    Mounted over the folders Debian's base already has, so no trace of them is left."""
    return [f"--volume={p}:{p}:ro" for p in ("/etc/apt/sources.list.d", "/etc/apt/apt.conf.d",
                                             "/etc/apt/trusted.gpg.d", "/etc/apt/sources.list")
            if os.path.exists(p)]


# ------------------------------------------------------------------ building


def build_with_docker(tag: str) -> None:
    say(f"building {tag} with docker")
    with tempfile.TemporaryDirectory(prefix="kproxy-build-") as scratch:
        proc = run(["docker", "build", *build_secrets(Path(scratch)), "-t", tag, str(ROOT)])
    if proc.returncode:
        raise SystemExit(proc.returncode)


def remove_older_builds(keep: str) -> None:
    """Untag images of earlier inputs: vfs stores every layer whole, disks fill up."""
    listed = json.loads(buildah("images", "--json").stdout or "[]")
    for image in listed:
        for name in image.get("names") or []:
            if re.fullmatch(rf"{REPO}:[0-9a-f]{{16}}", name) and name != keep:
                buildah("rmi", name)


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
                   "--layers", "--force-rm", "--pull=false", *apt_volumes(),
                   *build_secrets(Path(scratch)), "-t", hashed,
                   "-f", str(ROOT / "Dockerfile"), str(ROOT)]
            proc = run(cmd)
        if proc.returncode:
            raise SystemExit(f"image: buildah bud failed ({proc.returncode})")
        say(f"built {hashed} in {time.monotonic() - started:.0f} s")
        remove_older_builds(hashed)
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
