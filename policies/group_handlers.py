"""Handlers that watch consumer groups in the traffic the proxy relays, changing nothing.

Requests of the group APIs are decoded and remembered on their connection by
correlation id (a response does not repeat the group id); their responses are
decoded and fed, with the request, to the shared ``GroupTracker``. Every handler
here returns "forward as received" / ``Handled()``: frames stay byte-exact. A frame
that cannot be decoded (or anything else going wrong here) is counted and the
frame relayed unchanged; observation never ends a connection.

High watermarks come from Fetch responses: whole ones (every v16+ response, which
the address rewriter receives whole anyway, and smaller responses of other
versions) are walked to the end; of a large response relayed cut-through only its
head is seen, so only its first partitions report (``fetch_watermarks``).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.messages import decode_request, decode_response
from kproxy.codecs.peek import RequestPeek
from kproxy.codecs.registry import spec_for
from kproxy.codecs.schemas.consumer_protocol import ASSIGNMENT, decode_embedded
from kproxy.policies.connection import (
    ConnectionState,
    Handled,
    RequestDecision,
    ResponseHandler,
)
from kproxy.policies.fetch_watermarks import TopicNames, Watermark, fetch_watermarks
from kproxy.policies.groups import GroupTracker

log = logging.getLogger("kproxy.groups")

GROUP_APIS = (api_keys.JOIN_GROUP, api_keys.SYNC_GROUP, api_keys.HEARTBEAT,
              api_keys.LEAVE_GROUP, api_keys.OFFSET_COMMIT, api_keys.CONSUMER_GROUP_HEARTBEAT,
              api_keys.SHARE_GROUP_HEARTBEAT, api_keys.STREAMS_GROUP_HEARTBEAT)
MAX_PENDING = 1_000  # group requests remembered per connection awaiting their response
_CORRELATION = struct.Struct(">i")

Body = dict[str, Any]


@dataclass
class GroupWatch:
    """What the group handlers of every connection share."""

    tracker: GroupTracker
    clock: Callable[[], float]  # seconds, monotonic
    names: TopicNames
    watermark_walks: int = 0  # Fetch responses walked (whole or by their head)

    def failed(self, what: str, exc: BaseException) -> None:
        self.tracker.decode_failures += 1
        log.debug("group tracking could not read %s: %r", what, exc)


def count_assignment(raw: bytes | None) -> int | None:
    """Partitions in a consumer-protocol assignment; None when it is not one."""
    if not raw:
        return 0 if raw is not None else None
    try:
        _, body = decode_embedded(ASSIGNMENT, raw)
    except CodecError:
        return None
    return sum(len(tp["partitions"]) for tp in body["assigned_partitions"])


class GroupRequest:
    """Remembers a group request until its response; JoinGroup starts a round."""

    decides_now = True  # always None (ConnectionState.in_lane)

    def __init__(self, watch: GroupWatch) -> None:
        self.watch = watch

    def request(self, conn: ConnectionState, peek: RequestPeek,
                body: memoryview) -> RequestDecision:
        if spec_for(peek.api_key, peek.api_version, response=False) is None:
            return None  # a version no schema here reads (ShareGroupHeartbeat v0): relayed
        try:
            req = decode_request(body).body
            pending = conn.pending
            pending[peek.correlation_id] = (peek.api_key, req)
            while len(pending) > MAX_PENDING:
                del pending[next(iter(pending))]
            if peek.api_key == api_keys.JOIN_GROUP:
                self.watch.tracker.join_request(
                    req["group_id"], req["member_id"], req["protocol_type"], req.get("reason"),
                    self.watch.clock(), req.get("rebalance_timeout_ms", -1))
        except Exception as exc:  # observation must never break forwarding
            self.watch.failed(api_keys.api_name(peek.api_key) + " request", exc)
        return None


class GroupResponse:
    """Feeds a group API's response, with its request, to the tracker."""

    def __init__(self, watch: GroupWatch, api_key: int) -> None:
        self.watch = watch
        self.api_key = api_key

    def wants(self, api_version: int) -> bool:
        return True  # small and rare: always seen whole

    def response(self, conn: ConnectionState, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled:
        try:
            correlation_id = _CORRELATION.unpack_from(body)[0]
            entry = conn.pending.pop(correlation_id, None)
            if entry is not None and entry[0] == self.api_key:
                resp = decode_response(body, self.api_key, api_version).body
                who = self._feed(api_version, entry[1], resp)
                if who is not None:
                    info = conn.info
                    software = f"{info.software_name or ''} {info.software_version or ''}"
                    self.watch.tracker.identify(who[0], who[1], info.client_id,
                                                software.strip(), self.watch.clock())
        except Exception as exc:  # observation must never break forwarding
            self.watch.failed(api_keys.api_name(self.api_key) + " response", exc)
        return Handled()

    def _feed(self, version: int, req: Body, resp: Body) -> tuple[str, str | None] | None:
        """Hands one exchange to the tracker; returns (group, member) whose connection
        this was, when the exchange names one member."""
        t = self.watch.tracker
        now = self.watch.clock()
        key = self.api_key
        error = resp.get("error_code", 0)
        if key == api_keys.JOIN_GROUP:
            members = resp["members"]
            t.join_response(req["group_id"], error, resp["generation_id"],
                            resp.get("protocol_name"), resp["leader"], resp["member_id"],
                            [m["member_id"] for m in members] if members else None, now)
            return req["group_id"], resp["member_id"]
        if key == api_keys.SYNC_GROUP:
            t.sync_response(req["group_id"], req["member_id"], req["generation_id"], error,
                            count_assignment(resp["assignment"]), now)
            return req["group_id"], req["member_id"]
        if key == api_keys.HEARTBEAT:
            t.heartbeat(req["group_id"], req["member_id"], error, now)
            return req["group_id"], req["member_id"]
        if key == api_keys.LEAVE_GROUP:
            if version >= 3:
                ids = [m["member_id"] for m in req["members"]]
                for m in resp["members"]:
                    t.error(req["group_id"], m["error_code"], now)
            else:
                ids = [req["member_id"]]
            t.leave(req["group_id"], ids, error, now)
        elif key == api_keys.OFFSET_COMMIT:
            self._commit(req, resp, now)
        elif key == api_keys.CONSUMER_GROUP_HEARTBEAT:
            assignment = resp.get("assignment")
            assigned = None if assignment is None else sum(
                len(tp["partitions"]) for tp in assignment["topic_partitions"])
            t.consumer_heartbeat(req["group_id"], req["member_id"], req["member_epoch"],
                                 req.get("server_assignor"), error, resp.get("member_id"),
                                 resp["member_epoch"], assigned, now)
            return req["group_id"], resp.get("member_id") or req["member_id"]
        elif key == api_keys.SHARE_GROUP_HEARTBEAT:
            assignment = resp.get("assignment")
            assigned = None if assignment is None else sum(
                len(tp["partitions"]) for tp in assignment["topic_partitions"])
            t.consumer_heartbeat(req["group_id"], req["member_id"], req["member_epoch"],
                                 None, error, resp.get("member_id"), resp["member_epoch"],
                                 assigned, now, protocol="share")
            return req["group_id"], resp.get("member_id") or req["member_id"]
        elif key == api_keys.STREAMS_GROUP_HEARTBEAT:
            # The application's own endpoints (PartitionsByUserEndpoint, for interactive
            # queries) are in the response: read nothing of them, change nothing.
            tasks = resp.get("active_tasks")
            assigned = None if tasks is None else sum(len(x["partitions"]) for x in tasks)
            t.consumer_heartbeat(req["group_id"], req["member_id"], req["member_epoch"],
                                 None, error, resp.get("member_id"), resp["member_epoch"],
                                 assigned, now, protocol="streams")
            return req["group_id"], resp.get("member_id") or req["member_id"]
        return None

    def _commit(self, req: Body, resp: Body, now: float) -> None:
        """Offsets the coordinator accepted (per-partition error 0) count as committed."""
        t = self.watch.tracker
        group = req["group_id"]
        ok = {(topic["name"], p["partition_index"])
              for topic in resp["topics"] for p in topic["partitions"]
              if p["error_code"] == 0}
        for topic in resp["topics"]:
            for p in topic["partitions"]:
                t.error(group, p["error_code"], now)
        t.committed(group, [(topic["name"], p["partition_index"], p["committed_offset"])
                            for topic in req["topics"] for p in topic["partitions"]
                            if (topic["name"], p["partition_index"]) in ok], now)


class FetchWatermarks:
    """Reads high watermarks from Fetch responses; wraps the address rewriter (v16+)."""

    def __init__(self, watch: GroupWatch, inner: ResponseHandler | None) -> None:
        self.watch = watch
        self.inner = inner

    def wants(self, api_version: int) -> bool:
        return self.inner is not None and self.inner.wants(api_version)

    def response(self, conn: ConnectionState, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled:
        assert self.inner is not None
        end = self.walk(upstream_version, body)
        if end is not None and end == len(body) - 1 and body[end] == 0:
            # One walk serves both: no top-level tagged fields, so no NodeEndpoints for
            # the address rewriter to change (it would walk the records again to see that).
            return Handled()
        return self.inner.response(conn, api_version, upstream_version, body)

    def observe(self, conn: ConnectionState, api_version: int, body: memoryview | bytes,
                complete: bool) -> None:
        """A Fetch response (or, when not ``complete``, its head) the proxy relays."""
        self.walk(api_version, body)

    def stream(self, conn: ConnectionState, api_version: int, size: int) -> Any:
        """A large response relayed as it arrives: its high watermarks come from the
        walk that relays it (``policies.handlers.FetchStream``)."""
        stream = getattr(self.inner, "stream", None)
        return None if stream is None else stream(conn, api_version, size, self.record)

    def walk(self, api_version: int, body: memoryview | bytes) -> int | None:
        """Record the high watermarks in ``body``; where its topics end (None: not reached)."""
        end = None
        marks: list[Watermark] = []
        try:
            end = fetch_watermarks(api_version, body, marks)
        except Exception as exc:  # observation must never break forwarding
            self.watch.failed("Fetch response", exc)
            return end
        self.record(marks)
        return end

    def record(self, marks: list[Watermark]) -> None:
        """High watermarks (topic id or name, partition, watermark) read from a response."""
        watch = self.watch
        try:
            watch.watermark_walks += 1
            if not marks:
                return
            names = watch.names
            named = []
            for topic, partition, hwm in marks:
                name = names.name(topic)
                if name is not None:
                    named.append((name, partition, hwm))
            watch.tracker.high_watermarks(named, watch.clock())
        except Exception as exc:  # observation must never break forwarding
            watch.failed("Fetch response", exc)


class MetadataTopicNames:
    """Wraps the Metadata handler: learns topic id -> name (Fetch v13+ names topics by
    id, OffsetCommit by name). Decoded only when the topics part changed."""

    def __init__(self, watch: GroupWatch, inner: ResponseHandler) -> None:
        self.watch = watch
        self.inner = inner
        self._last: int | None = None

    def wants(self, api_version: int) -> bool:
        return self.inner.wants(api_version)

    def response(self, conn: ConnectionState, api_version: int, upstream_version: int,
                 body: memoryview) -> Handled:
        handled = self.inner.response(conn, api_version, upstream_version, body)
        if upstream_version >= 10:
            try:
                digest = hash(body[4:].tobytes())
                if digest != self._last:
                    resp = decode_response(body, api_keys.METADATA, upstream_version)
                    self.watch.names.learn(resp.body["topics"])
                    self._last = digest
            except Exception as exc:  # never break forwarding
                self.watch.failed("Metadata response", exc)
        return handled
