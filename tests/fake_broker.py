"""FAKE BROKER — a scripted stand-in, used only where a real one cannot show the case.

tansu is always a single node (id 111), so the multi-node metadata shapes, node ids
outside the proxy's range, brokers that come and go, and brokers that misbehave
(never answer, hang up mid-response) are produced by this script instead. It
answers ApiVersions, Metadata and FindCoordinator with our own codec, one
listening port per fake node, and records which port each connection reached.

With ``fetch_bytes`` it answers Fetch v4 with a response of that many record bytes
(zeros; nothing in the path decodes them): tansu caps a fetch response at about 5 MB,
and the memory benchmark needs 50 MB ones.
With ``share_groups`` it also advertises ShareFetch and ShareAcknowledge (KIP-932;
tansu speaks no share groups) and answers both with a scripted response whose
NodeEndpoints name every fake node at its backend port, after a partition whose
records are ``SHARE_RECORDS``, so a test can see them rewritten and the records intact.

With ``canned`` (api key -> (highest version, whole response frame)) it advertises those
APIs and answers each with its frame exactly as given (header included): for APIs tansu
does not speak (streams groups, KIP-1071), with frames an independent encoder wrote.

With ``sasl_users`` it also stands in for a SASL/PLAIN broker (tansu 0.6's
``--authentication`` could not be given a user here): SaslHandshake v1 and
SaslAuthenticate, and like Kafka it closes a connection that sends anything
else before authenticating.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

import trio

from kproxy.codecs import api_keys
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.messages import decode_request, encode_response_parts
from kproxy.codecs.peek import peek_request


@dataclass
class FakeBroker:
    node_ids: list[int]
    cluster_id: str = "fake-cluster"
    coordinator: int | None = None
    mode: str = "normal"  # "normal" | "silent" | "cut-mid-response"
    delay: float = 0.0  # seconds before each answer
    ports: dict[int, int] = field(default_factory=dict)  # node id -> listening port
    hidden: set[int] = field(default_factory=set)  # nodes left out of Metadata
    connections: dict[int, int] = field(default_factory=dict)  # node id -> connections
    requests: list[tuple[int, int, int]] = field(default_factory=list)
    sasl_users: dict[str, str] | None = None  # user -> password; None: no SASL
    authenticated: list[str] = field(default_factory=list)  # users, in order
    fetch_bytes: int = 0  # > 0: answer Fetch v4 with this many bytes of records
    _records: bytes = b""  # those records, one buffer shared by every connection
    share_groups: bool = False  # advertise and answer ShareFetch / ShareAcknowledge
    streams: set[trio.SocketStream] = field(default_factory=set)  # connections open now
    canned: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # key -> (max, frame)

    async def start(self, nursery: trio.Nursery) -> FakeBroker:
        self._records = bytes(self.fetch_bytes)
        for node in self.node_ids:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            self.ports[node] = listeners[0].socket.getsockname()[1]
            nursery.start_soon(trio.serve_listeners, self._handler(node), listeners)
        return self

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports[self.node_ids[0]]}"

    def _handler(self, node: int):  # type: ignore[no-untyped-def]
        async def handle(stream: trio.SocketStream) -> None:
            self.connections[node] = self.connections.get(node, 0) + 1
            reader = FrameReader()
            conn = {"authenticated": self.sasl_users is None}
            self.streams.add(stream)
            try:
                while data := await stream.receive_some(65536):
                    reader.feed(data)
                    for frame in reader.frames():
                        if self.fetch_bytes and peek_request(frame).api_key == api_keys.FETCH:
                            await self._big_fetch(stream, frame)
                            continue
                        reply = self.answer(frame, conn)
                        if reply is None:  # refused: a broker closes the connection
                            await stream.aclose()
                            return
                        if self.mode == "silent":
                            continue
                        if self.mode == "cut-mid-response":
                            await stream.send_all(reply[: len(reply) // 2])
                            await stream.aclose()
                            return
                        if self.delay:
                            await trio.sleep(self.delay)
                        await stream.send_all(reply)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                self.streams.discard(stream)

        return handle

    async def _big_fetch(self, stream: trio.SocketStream, frame: bytes) -> None:
        """A Fetch v4 response for one partition carrying ``fetch_bytes`` of records,
        sent from one shared buffer (the fake must not hold a copy per connection)."""
        peek = peek_request(frame)
        assert peek.api_version == 4, "the big-fetch fake speaks Fetch v4 only"
        topic = b"big"
        head = (struct.pack(">ii", peek.correlation_id, 0)  # header, throttle_time_ms
                + struct.pack(">ih", 1, len(topic)) + topic
                + struct.pack(">iihqqi", 1, 0, 0, 1, 1, 0)  # partition 0, no error, no aborts
                + struct.pack(">i", self.fetch_bytes))
        await stream.send_all(struct.pack(">i", len(head) + self.fetch_bytes) + head)
        await stream.send_all(self._records)

    def answer(self, frame: bytes, conn: dict[str, bool] | None = None) -> bytes | None:
        peek = peek_request(frame)
        self.requests.append((peek.api_key, peek.api_version, peek.correlation_id))
        key, version = peek.api_key, peek.api_version
        authenticated = conn is None or conn["authenticated"]
        if key == api_keys.API_VERSIONS:
            version = min(version, 3)
            apis = [(0, 11), (1, 17), (3, 12), (10, 6), (18, 3), (60, 1)]
            if self.sasl_users is not None:
                apis += [(17, 1), (36, 2)]
            if self.share_groups:
                apis += [(api_keys.SHARE_FETCH, 3), (api_keys.SHARE_ACKNOWLEDGE, 3)]
            apis += [(k, v) for k, (v, _) in sorted(self.canned.items())]
            body = {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
                {"api_key": k, "min_version": 0, "max_version": v} for k, v in apis]}
        elif key in self.canned and authenticated:
            frame_out = self.canned[key][1]
            return struct.pack(">i", len(frame_out)) + frame_out
        elif key == api_keys.SASL_HANDSHAKE and self.sasl_users is not None:
            body = {"error_code": 0 if decode_request(frame).body["mechanism"] == "PLAIN"
                    else 33, "mechanisms": ["PLAIN"]}
        elif key == api_keys.SASL_AUTHENTICATE and self.sasl_users is not None:
            token = bytes(decode_request(frame).body["auth_bytes"])
            _, user, password = token.decode().split("\0")
            ok = self.sasl_users.get(user) == password
            if ok and conn is not None:
                conn["authenticated"] = True
                self.authenticated.append(user)
            body = {"error_code": 0 if ok else 58, "auth_bytes": b"",
                    "error_message": None if ok else "Authentication failed: invalid "
                    "credentials", "session_lifetime_ms": 0}
        elif not authenticated:
            return None
        elif key == api_keys.METADATA:
            body = {"throttle_time_ms": 0, "cluster_id": self.cluster_id,
                    "controller_id": self.node_ids[0], "topics": [],
                    "brokers": [{"node_id": n, "host": "127.0.0.1", "port": p, "rack": None}
                                for n, p in self.ports.items() if n not in self.hidden]}
        elif key == api_keys.FIND_COORDINATOR:
            node = self.coordinator if self.coordinator is not None else self.node_ids[0]
            one = {"node_id": node, "host": "127.0.0.1", "port": self.ports[node],
                   "error_code": 0, "error_message": None}
            body = ({"throttle_time_ms": 0, "coordinators": [{"key": "g", **one}]}
                    if version >= 4 else {"throttle_time_ms": 0, **one})
        elif key in (api_keys.SHARE_FETCH, api_keys.SHARE_ACKNOWLEDGE) and self.share_groups:
            body = self._share_answer(key)
        else:
            raise AssertionError(f"fake broker got unexpected API {key}")
        data = encode_response_parts(key, version, peek.correlation_id, body)
        return struct.pack(">i", len(data)) + data

    def _share_answer(self, key: int) -> dict[str, object]:
        leader = {"leader_id": self.node_ids[-1], "leader_epoch": 3}
        partition: dict[str, object] = {"partition_index": 0, "error_code": 6,
                                        "error_message": None, "current_leader": leader}
        if key == api_keys.SHARE_FETCH:
            partition.update(acknowledge_error_code=0, acknowledge_error_message=None,
                             records=SHARE_RECORDS,
                             acquired_records=[{"first_offset": 0, "last_offset": 4,
                                                "delivery_count": 1}])
        return {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                "acquisition_lock_timeout_ms": 15000,
                "responses": [{"topic_id": SHARE_TOPIC_ID, "partitions": [partition]}],
                "node_endpoints": [{"node_id": n, "host": "127.0.0.1", "port": p,
                                    "rack": None} for n, p in self.ports.items()]}


SHARE_TOPIC_ID = uuid.UUID(int=0x5EED)
SHARE_RECORDS = bytes(range(256)) * 4  # stands in for a record batch: only its bytes matter
