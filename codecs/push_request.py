"""A PushTelemetry request's fields in one unpack, where the general decoder takes fifty
calls.

A client pushes its metrics every interval on the connection it produces on, and the
proxy answers each push in its turn: what the decode costs, the requests behind it
wait. The usual push (v0, no tagged fields, metrics of under 16 KiB) is read here
with one ``struct`` unpack; anything else (another version, tagged fields, a null or
larger payload, a malformed body) goes to the general decoder, which reads it or says
what is wrong with it. Both give the same fields (``tests/unit/test_push_request.py``).
"""

from __future__ import annotations

import struct
import uuid

from kproxy.codecs.api_keys import PUSH_TELEMETRY
from kproxy.codecs.interpreter import Message
from kproxy.codecs.messages import decode_request_body

# client instance id, subscription id, terminating, compression type
_FIXED = struct.Struct(">16siBb")
_FIXED_SIZE = _FIXED.size  # 22


def decode_push(frame: bytes | bytearray | memoryview, api_version: int,
                body_offset: int) -> Message:
    """The body of a PushTelemetry request frame whose header was read already.
    Raises ``CodecError`` as ``decode_request_body`` does."""
    at = body_offset + _FIXED_SIZE
    if api_version == 0 and len(frame) > at:
        first = frame[at]  # the metrics' compact length (+1): one varint byte, or two
        if 1 <= first < 0x80:
            size, start = first - 1, at + 1
        elif len(frame) > at + 1 and frame[at + 1] < 0x80:
            size, start = ((first & 0x7F) | (frame[at + 1] << 7)) - 1, at + 2
        else:
            size, start = -1, 0
        # Exactly the metrics, then an empty tagged-field section, then the end.
        if size >= 0 and start + size + 1 == len(frame) and frame[start + size] == 0:
            instance, subscription, terminating, compression = _FIXED.unpack_from(
                frame, body_offset)
            if terminating <= 1:
                return {"client_instance_id": uuid.UUID(bytes=instance),
                        "subscription_id": subscription, "terminating": terminating == 1,
                        "compression_type": compression,
                        "metrics": memoryview(frame)[start:start + size]}
    return decode_request_body(frame, PUSH_TELEMETRY, api_version, body_offset)
