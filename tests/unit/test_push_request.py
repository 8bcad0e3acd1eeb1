"""A PushTelemetry body read in one unpack gives exactly what the general decoder gives,
and anything the shortcut does not take goes to the general decoder.

``decode_push`` runs for every push the proxy answers, in the connection's turn
(issue 30: a push's cost delays the produce requests behind it).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.codecs import api_keys, push_request
from kproxy.codecs.errors import CodecError
from kproxy.codecs.messages import decode_request_body
from kproxy.codecs.peek import peek_request

from ..support import encode_request


def both(frame: bytes, version: int, offset: int) -> tuple[Any, Any]:
    out: list[Any] = []
    for decode in (push_request.decode_push,
                   lambda f, v, o: decode_request_body(f, api_keys.PUSH_TELEMETRY, v, o)):
        try:
            body = decode(frame, version, offset)
            out.append({**body, "metrics": None if body["metrics"] is None
                        else bytes(body["metrics"])})
        except CodecError:
            out.append("CodecError")
    return out[0], out[1]


def push_frame(body: dict[str, Any]) -> tuple[bytes, int]:
    frame = encode_request(api_keys.PUSH_TELEMETRY, 0, 9, body)[4:]
    return frame, peek_request(frame).body_offset


pushes = st.fixed_dictionaries({
    "client_instance_id": st.uuids(),
    "subscription_id": st.integers(-(2**31), 2**31 - 1),
    "terminating": st.booleans(),
    "compression_type": st.integers(-128, 127),
    "metrics": st.binary(max_size=300) | st.sampled_from([b"", b"x" * 126, b"x" * 127,
                                                          b"x" * 16382, b"x" * 16383,
                                                          b"x" * 20000]),
})


@settings(max_examples=1500, deadline=None)
@given(pushes)
def test_the_shortcut_reads_every_push_as_the_general_decoder(body: dict[str, Any]) -> None:
    frame, offset = push_frame(body)
    fast, general = both(frame, 0, offset)
    assert fast == general == body


@settings(max_examples=1500, deadline=None)
@given(pushes, st.integers(0, 40), st.binary(min_size=1, max_size=3),
       st.sampled_from(["replace", "insert", "cut", "append"]))
def test_a_damaged_push_reads_the_same_or_fails_the_same(
        body: dict[str, Any], at: int, junk: bytes, how: str) -> None:
    frame, offset = push_frame(body)
    at = offset + at % (len(frame) - offset)
    damaged = {"replace": frame[:at] + junk + frame[at + len(junk):],
               "insert": frame[:at] + junk + frame[at:],
               "cut": frame[:at],
               "append": frame + junk}[how]
    fast, general = both(damaged, 0, offset)
    assert fast == general


def test_the_usual_push_never_reaches_the_general_decoder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("the general decoder was asked")

    monkeypatch.setattr(push_request, "decode_request_body", refuse)
    for size in (0, 1, 126, 127, 2000, 16382):
        body = {"client_instance_id": uuid.uuid4(), "subscription_id": 7,
                "terminating": False, "compression_type": 4, "metrics": b"m" * size}
        frame, offset = push_frame(body)
        assert bytes(push_request.decode_push(frame, 0, offset)["metrics"]) == body["metrics"]


def test_tagged_fields_and_other_versions_go_to_the_general_decoder() -> None:
    body = {"client_instance_id": uuid.uuid4(), "subscription_id": 7,
            "terminating": True, "compression_type": 0, "metrics": b"abc"}
    frame, offset = push_frame(body)
    tagged = frame[:-1] + b"\x01\x05\x02hi"  # one unknown tag of two bytes
    fast, general = both(tagged, 0, offset)
    assert fast == general != "CodecError"
    assert both(frame, 1, offset) == ("CodecError", "CodecError")  # no v1 exists
