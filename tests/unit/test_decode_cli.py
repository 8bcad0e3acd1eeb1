"""``kproxy decode`` on real frames of each decoded API, and on corrupted ones."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from kproxy.codecs.registry import spec_for

from ..conftest import Vector, load_vectors

KPROXY = [sys.executable, "-m", "kproxy.cli"]


def _one_of_each() -> list[Vector]:
    seen: dict[tuple[int, str], Vector] = {}
    for v in load_vectors():
        if spec_for(v.api_key, v.api_version, response=v.direction == "response"):
            seen.setdefault((v.api_key, v.direction), v)
    return list(seen.values())


def _args(vec: Vector) -> list[str]:
    if vec.direction == "request":
        return ["--request"]
    return ["--response", "--api-key", str(vec.api_key), "--api-version", str(vec.api_version)]


def _run(args: list[str], data: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*KPROXY, "decode", *args], input=data, capture_output=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("vec", _one_of_each(), ids=lambda v: v.id)
def test_roundtrip_check_on_real_frames(vec: Vector) -> None:
    framed = struct.pack(">i", len(vec.frame)) + vec.frame
    proc = _run([*_args(vec), "--check-roundtrip"], framed)
    assert proc.returncode == 0, proc.stderr
    assert b"round trip OK" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["api"] == vec.api_name
    hex_proc = _run([*_args(vec), "--hex", "--check-roundtrip"], framed.hex().encode())
    assert hex_proc.returncode == 0 and json.loads(hex_proc.stdout) == out


@pytest.mark.parametrize("vec", _one_of_each(), ids=lambda v: v.id)
def test_corrupted_frames_fail_cleanly(vec: Vector) -> None:
    truncated = vec.frame[: max(len(vec.frame) - 3, 6)]
    for data in (struct.pack(">i", len(truncated)) + truncated,  # body cut short
                 struct.pack(">i", len(vec.frame) + 9) + vec.frame):  # lying size prefix
        proc = _run(_args(vec), data)
        assert proc.returncode == 2
        lines = proc.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kproxy decode: error: ")
        assert "Traceback" not in proc.stderr.decode()
        assert " at offset " in lines[0]


def test_response_without_api_key_is_a_usage_error() -> None:
    proc = _run(["--response"], b"\x00\x00\x00\x04\x00\x00\x00\x01")
    assert proc.returncode == 2
    assert b"needs --api-key and --api-version" in proc.stderr


def test_opaque_request_shows_header_only() -> None:
    # ListOffsets is relayed without decoding (Heartbeat was, until group tracking).
    opaque = next(v for v in load_vectors() if v.api_name == "ListOffsets"
                  and v.direction == "request")
    proc = _run(["--check-roundtrip"], struct.pack(">i", len(opaque.frame)) + opaque.frame)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["api"] == "ListOffsets" and out["body"]["opaque_bytes"] > 0


def test_out_of_order_header_tags_are_an_error_not_a_silent_reencode() -> None:
    """Written back sorted, these tags would differ from the input: refuse, say where."""
    body = struct.pack(">hhih", 3, 12, 7, 2) + b"me" + b"\x02\x05\x00\x03\x00" + b"\x01\x01\x00"
    proc = _run(["--check-roundtrip"], struct.pack(">i", len(body)) + body)
    assert proc.returncode == 2
    assert b"tag 3 out of order or repeated" in proc.stderr and b"offset 15" in proc.stderr
