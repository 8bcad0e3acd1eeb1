"""Reading the backend's broker set with a Metadata request of the proxy's own."""

from __future__ import annotations

import struct

import trio

from kproxy.codecs import api_keys
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.headers import RequestHeader, write_request_header
from kproxy.codecs.interpreter import encode_into
from kproxy.codecs.messages import decode_response
from kproxy.codecs.primitives import Writer
from kproxy.codecs.schemas import metadata
from kproxy.policies.addressing import BrokerAddress
from kproxy.policies.rewrite import Seen
from kproxy.runtime.upstream import BootstrapRotation

# Metadata v4 is the oldest version every current broker still serves (Kafka 4
# dropped v0-v3) and needs no flexible-version handling.
DISCOVERY_VERSION = 4
CLIENT_ID = "kproxy-discovery"


def metadata_request(correlation_id: int) -> bytes:
    w = Writer()
    write_request_header(w, RequestHeader(api_keys.METADATA, DISCOVERY_VERSION, correlation_id,
                                          CLIENT_ID))
    encode_into(metadata.REQUEST, DISCOVERY_VERSION,
                {"topics": [], "allow_auto_topic_creation": False}, w)
    body = w.getvalue()
    return struct.pack(">i", len(body)) + body


async def discover(rotation: BootstrapRotation, timeout: float, max_frame: int) -> Seen:
    """One Metadata round trip; raises on any failure (the caller logs and retries)."""
    stream, _ = await rotation.connect(timeout)
    async with stream:
        with trio.fail_after(timeout):
            await stream.send_all(metadata_request(1))
            reader = FrameReader(max_frame)
            while (frame := reader.next_frame()) is None:
                data = await stream.receive_some(65536)
                if not data:
                    raise ConnectionError("broker closed the discovery connection")
                reader.feed(data)
    body = decode_response(frame, api_keys.METADATA, DISCOVERY_VERSION).body
    return Seen(
        nodes={b["node_id"]: BrokerAddress(b["host"], b["port"], b.get("rack"))
               for b in body["brokers"]},
        complete=True, cluster_id=body.get("cluster_id"))
