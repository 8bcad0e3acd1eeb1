"""``kproxy decode``: one size-prefixed Kafka frame in, its decoded JSON out.

An operator's tool for looking at a captured frame, and the way the tests prove
that every decoder re-encodes real frames byte for byte.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from typing import Any, BinaryIO

from kproxy.codecs.api_keys import api_name
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import read_request_header, write_request_header
from kproxy.codecs.messages import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    to_jsonable,
)
from kproxy.codecs.peek import peek_request
from kproxy.codecs.primitives import Reader, Writer
from kproxy.codecs.registry import spec_for


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "decode",
        help="decode one size-prefixed Kafka frame to JSON",
        description="Read one size-prefixed Kafka frame (binary on stdin, or hex with --hex) "
        "and print it as JSON. Exit status 2 on malformed input.",
    )
    p.add_argument("file", nargs="?", help="read the frame from this file instead of stdin")
    p.add_argument("--hex", action="store_true", help="the input is hex text (spaces ignored)")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--request", dest="kind", action="store_const", const="request",
                      help="the frame is a request (default)")
    kind.add_argument("--response", dest="kind", action="store_const", const="response",
                      help="the frame is a response; needs --api-key and --api-version")
    p.add_argument("--api-key", type=int, help="api key of the request a response answers")
    p.add_argument("--api-version", type=int,
                   help="api version of the request a response answers")
    p.add_argument("--check-roundtrip", action="store_true",
                   help="re-encode the decoded message; exit 1 if the bytes differ")
    p.set_defaults(kind="request", func=run)


class UsageError(Exception):
    pass


def _read_input(args: argparse.Namespace, stdin: BinaryIO) -> bytes:
    if args.file:
        with open(args.file, "rb") as fh:
            raw = fh.read()
    else:
        raw = stdin.read()
    if args.hex:
        text = raw.decode("ascii", errors="replace")
        try:
            raw = bytes.fromhex("".join(text.split()))
        except ValueError as exc:
            raise UsageError(f"input is not hex: {exc}") from None
    return raw


def _unframe(raw: bytes) -> bytes:
    if len(raw) < 4:
        raise CodecError(f"need a 4-byte size prefix, got {len(raw)} bytes", what="frame size",
                         offset=0)
    (size,) = struct.unpack_from(">i", raw)
    if size != len(raw) - 4:
        raise CodecError(f"size prefix says {size} bytes but {len(raw) - 4} follow",
                         what="frame size", offset=0)
    return raw[4:]


def decode_frame(args: argparse.Namespace, body: bytes) -> tuple[dict[str, Any], bytes]:
    """The JSON view of a frame body and the bytes it re-encodes to."""
    if args.kind == "response":
        if args.api_key is None or args.api_version is None:
            raise UsageError("--response needs --api-key and --api-version")
        resp = decode_response(body, args.api_key, args.api_version)
        view = {
            "api": api_name(args.api_key), "api_key": args.api_key,
            "api_version": args.api_version,
            "header": {"correlation_id": resp.header.correlation_id,
                       "tagged": resp.header.tagged},
            "body": resp.body,
        }
        return view, encode_response(resp)
    peek = peek_request(body)
    if spec_for(peek.api_key, peek.api_version, response=False) is None:
        # Not an API the proxy decodes: show the header, carry the body opaquely.
        r = Reader(body)
        hdr = read_request_header(r)
        w = Writer()
        write_request_header(w, hdr)
        w.raw(body[r.pos :])
        view = {"api": api_name(hdr.api_key), "header": vars(hdr),
                "body": {"opaque_bytes": len(body) - r.pos},
                "expects_response": peek.expects_response}
        return view, w.getvalue()
    req = decode_request(body)
    view = {"api": api_name(req.header.api_key), "header": vars(req.header), "body": req.body,
            "expects_response": peek.expects_response}
    return view, encode_request(req)


def run(args: argparse.Namespace, stdin: BinaryIO | None = None,
        stdout: Any = None) -> int:
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    try:
        body = _unframe(_read_input(args, stdin))
        view, reencoded = decode_frame(args, body)
    except (CodecError, UsageError, OSError) as exc:
        print(f"kproxy decode: error: {exc}", file=sys.stderr)
        return 2
    json.dump(to_jsonable(view), stdout, indent=2, sort_keys=False)
    stdout.write("\n")
    if args.check_roundtrip:
        if reencoded != body:
            first = next((i for i, (a, b) in enumerate(zip(reencoded, body, strict=False))
                          if a != b), min(len(reencoded), len(body)))
            print(f"kproxy decode: round trip differs: {len(body)} bytes in, "
                  f"{len(reencoded)} out, first difference at offset {first}", file=sys.stderr)
            return 1
        print("kproxy decode: round trip OK", file=sys.stderr)
    return 0
