"""The ACL filter: ``[[acls]]`` enforced on every request, in the API's own error shape.

Built whenever any ACL is set, and put first in every chain (main listeners and
virtual clusters), so it sees the client's own names. A connection's principal is
``User:<name>`` from its SASL login or client certificate, ``User:ANONYMOUS`` without
either. Decisions come from ``policies.auth.acl`` (default deny, deny wins).

- Produce: refused partitions get TOPIC_AUTHORIZATION_FAILED (29) and the rest is
  forwarded (the request written again without them, their entries merged back in, as
  record-validation does); a denied transactional id refuses every partition with 53.
- Metadata: the response lists only the topics the principal may DESCRIBE; a topic it
  named and may not describe comes back with 29. Auto-creation is turned off (v4+)
  when the principal may not CREATE a named topic.
- CreateTopics, DeleteTopics, batched FindCoordinator and the admin APIs of
  ``acl_admin.ENTRY_APIS``: per entry, the rest forwarded and the results merged;
  ListGroups (``acl_admin.LISTINGS``): the response keeps the describable groups.
- Fetch, ListOffsets, OffsetForLeaderEpoch, OffsetCommit, TxnOffsetCommit, OffsetFetch:
  a denied topic's partitions get 29 and the rest is forwarded (``acl_partitions``);
  a denied group (batched OffsetFetch: per group), transactional id or follower fetch
  refuses the whole request.
- Every other API of ``acl_apis.APIS``: refused as a whole with its error (29, 30, 31
  or 53) when any of its checks fails.
- APIs in neither (the ACL and quota admin APIs, share groups, KIP-848 heartbeats, ...)
  are removed from ApiVersions and a request for one closes the connection (fail closed).

Each denied check is reported through ``on_deny`` (the audit log, rate-bounded by the
proxy); decisions are counted by the chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kproxy.codecs import api_keys
from kproxy.codecs.errors import CodecError
from kproxy.codecs.headers import (
    ResponseHeader,
    read_request_header,
    read_response_header,
    write_response_header,
)
from kproxy.codecs.interpreter import decode_from, encode_into
from kproxy.codecs.peek import RequestPeek
from kproxy.codecs.primitives import Reader, Writer
from kproxy.codecs.produce_request import walk
from kproxy.codecs.registry import DECODED
from kproxy.codecs.schema import MAX_VERSION, MessageSpec, Versions
from kproxy.policies.api_versions import offer_only
from kproxy.policies.auth.acl import Acls
from kproxy.policies.connection import Answer, Close, ConnectionState, Forward, RequestDecision
from kproxy.policies.filters.acl_admin import (
    CHECKED,
    LISTINGS,
    EntryApi,
    Listing,
    entry_api,
    keep,
    merge,
    offered,
    refuse,
)
from kproxy.policies.filters.acl_apis import APIS, CLUSTER, TXN_DENIED, Need
from kproxy.policies.filters.acl_partitions import TOPIC_DENIED, split
from kproxy.policies.filters.api import Filter
from kproxy.policies.filters.record_validation import refuse_partitions

ANONYMOUS = "User:ANONYMOUS"
ANY = Versions(0, MAX_VERSION)
DenyFn = Callable[[dict[str, Any]], None]
Msg = dict[str, Any]
Then = Callable[[memoryview, int], bytes]


def principal_of(conn: ConnectionState) -> str:
    """Kafka's principal form: ``User:alice``; ``User:ANONYMOUS`` without a login."""
    return f"User:{conn.principal}" if conn.principal else ANONYMOUS


def answer(spec: MessageSpec, version: int, correlation_id: int, body: Msg) -> bytes:
    """A response frame from a partial body (absent fields take their defaults)."""
    w = Writer()
    write_response_header(w, ResponseHeader(correlation_id), spec.api_key, version)
    encode_into(spec, version, body, w)
    return w.getvalue()


def _decode_request(spec: MessageSpec, version: int, body: memoryview) -> tuple[int, int, Msg]:
    r = Reader(body)
    read_request_header(r)
    head = r.pos
    msg = decode_from(spec, version, r)
    return head, r.pos, msg


def _reencode(body: memoryview, head: int, end: int, spec: MessageSpec, version: int,
              msg: Msg) -> bytes:
    """The request with a changed body; bytes after the body travel as sent."""
    w = Writer()
    w.raw(bytes(body[:head]))
    encode_into(spec, version, msg, w)
    return w.getvalue() + bytes(body[end:])


def _decode_response(spec: MessageSpec, version: int, body: memoryview) -> tuple[int, Msg]:
    r = Reader(body)
    read_response_header(r, spec.api_key, version)
    head = r.pos
    msg = decode_from(spec, version, r)
    r.expect_end(spec.name)
    return head, msg


def _with_body(body: memoryview, head: int, spec: MessageSpec, version: int, msg: Msg) -> bytes:
    w = Writer()
    w.raw(bytes(body[:head]))
    encode_into(spec, version, msg, w)
    return w.getvalue()


class AclFilter(Filter):
    """``[[acls]]`` enforced; one instance per proxy worker, rules replaced on reload."""

    kind = "acl"

    def __init__(self, acls: Acls, on_deny: DenyFn | None = None) -> None:
        self.acls = acls
        self.on_deny = on_deny
        self.name = "acl"
        self.requests = {key: ANY for key in range(256)}
        for key, api in APIS.items():
            self.requests[key] = api.versions
        self.requests.update(CHECKED)
        # Only ApiVersions is read on every response; the others a request changed are
        # finished by its ``Forward.then``.
        self.responses = {api_keys.API_VERSIONS: ANY}

    def describe(self) -> str:
        return f"{len(self.acls.rules)} ACL rules enforced (default deny); other APIs hidden"

    # ------------------------------------------------------------------ decisions

    def allowed(self, conn: ConnectionState, need: Need) -> bool:
        who = principal_of(conn)
        if self.acls.allowed(who, need.operation, need.resource, need.name):
            return True
        if need.operation == "idempotent_write":  # KIP-679: WRITE on any topic will do
            return any(r.allow and r.resource == "topic" and r.matches(
                who, "write", "topic", r.pattern) for r in self.acls.rules)
        if need.operation == "create" and need.resource == "topic":  # or CREATE cluster
            return self.acls.allowed(who, "create", "cluster", CLUSTER)
        return False

    def denied(self, conn: ConnectionState, needs: list[Need], api: str) -> list[Need]:
        out = [n for n in dict.fromkeys(needs) if not self.allowed(conn, n)]
        for need in out[:8]:  # a request naming thousands of topics: a few lines
            self._report(conn, api, need)
        return out

    def _report(self, conn: ConnectionState, api: str, need: Need) -> None:
        if self.on_deny is not None:
            self.on_deny({"event": "acl_denied", "principal": principal_of(conn), "api": api,
                          "resource": need.resource, "name": need.name,
                          "operation": need.operation.upper()})

    # ------------------------------------------------------------------ requests

    def on_request(self, conn: ConnectionState, peek: RequestPeek,
                   body: memoryview) -> RequestDecision:
        key, version = peek.api_key, peek.api_version
        name = api_keys.api_name(key)
        per_entry = entry_api(key, version)
        if per_entry is not None:
            return self._per_entry(conn, peek, body, per_entry)
        if key in LISTINGS:
            return self._listing(conn, body, version, LISTINGS[key])
        api = APIS.get(key)
        if api is None:
            allowed = offered(key)
            if allowed is None or (key != api_keys.API_VERSIONS and version not in allowed):
                return Close(f"{name} v{version} not offered under ACLs", "acl_api",
                             f"{name} v{version} is not enforced by the ACL filter (not in "
                             "its ApiVersions); connection closed", name)
            return None
        if key == api_keys.PRODUCE:
            return self._produce(conn, peek, body)
        head, end, msg = _decode_request(api.request, version, body)
        if key == api_keys.METADATA:
            return self._metadata(conn, body, head, end, msg, version)
        denied = self.denied(conn, api.needs(msg, version), name)
        if api.layout is not None and all(api.layout.splits(n.resource, version)
                                          for n in denied):
            return self._split(conn, peek, body, head, end, msg, denied)
        if not denied:
            return None
        assert api.whole is not None
        error = min(denied, key=_rank).error
        bad = frozenset(n.name for n in denied if n.resource == "topic")
        return Answer(answer(api.response, version, peek.correlation_id,
                             api.whole(msg, version, error, bad)))

    def _produce(self, conn: ConnectionState, peek: RequestPeek,
                 body: memoryview) -> RequestDecision:
        req = walk(body)
        txn_denied = bool(req.transactional_id) and bool(self.denied(
            conn, [Need("write", "transactional_id", str(req.transactional_id))], "Produce"))
        refused: dict[tuple[int, int], dict[str, Any]] = {}
        for t, topic in enumerate(req.topics):
            ok = not txn_denied and topic.topic is not None and not self.denied(
                conn, [Need("write", "topic", topic.topic)], "Produce")
            if not ok:
                code = TXN_DENIED if txn_denied else TOPIC_DENIED
                for p, part in enumerate(topic.partitions):
                    refused[(t, p)] = {"index": part.index, "error_code": code,
                                       "base_offset": -1, "log_append_time_ms": -1,
                                       "log_start_offset": -1, "record_errors": [],
                                       "error_message": None}
        if not refused:
            return None
        return refuse_partitions(body, peek, req, refused, Close(
            "produce denied with acks=0", "acl_denied", "a Produce with acks=0 was denied "
            "by the ACLs: connection closed (no response to carry the error)", "Produce"))

    def _metadata(self, conn: ConnectionState, body: memoryview, head: int, end: int,
                  msg: Msg, version: int) -> RequestDecision:
        named = msg.get("topics")
        requested = None
        if named is not None and (named or version >= 1):
            requested = frozenset(t["name"] for t in named if t.get("name") is not None)
        spec = APIS[3].request

        def then(resp: memoryview, v: int) -> bytes:
            return self._metadata_response(conn, resp, v, requested)

        if (requested and version >= 4 and msg.get("allow_auto_topic_creation", True)
                and not all(self.allowed(conn, Need("create", "topic", n))
                            for n in requested)):
            msg["allow_auto_topic_creation"] = False
            return Forward(_reencode(body, head, end, spec, version, msg), version, then)
        return Forward(bytes(body), version, then)

    def _metadata_response(self, conn: ConnectionState, resp: memoryview, version: int,
                           requested: frozenset[str] | None) -> bytes:
        spec = APIS[3].response
        head, msg = _decode_response(spec, version, resp)
        kept = []
        for topic in msg.get("topics") or []:
            tname = topic.get("name")
            if tname is not None and self.allowed(conn, Need("describe", "topic", tname)):
                kept.append(topic)
            elif requested and tname in requested:
                self.denied(conn, [Need("describe", "topic", tname)], "Metadata")
                kept.append({**topic, "error_code": TOPIC_DENIED, "partitions": [],
                             "is_internal": False})
        msg["topics"] = kept
        return _with_body(resp, head, spec, version, msg)

    def _per_entry(self, conn: ConnectionState, peek: RequestPeek, body: memoryview,
                   api: EntryApi) -> RequestDecision:
        """Denied entries answered here, the others forwarded, both merged in the
        response (``acl_admin``)."""
        version, name = peek.api_version, api_keys.api_name(peek.api_key)
        head, end, msg = _decode_request(api.request, version, body)
        if api.first is not None:
            denied = self.denied(conn, api.first(msg), name)
            if denied:
                return Answer(answer(api.response, version, peek.correlation_id,
                                     {"error_code": denied[0].error}))
        results = refuse(api, msg, lambda needs: self.denied(conn, needs, name))
        if not results:
            return None
        if not msg[api.field]:
            return Answer(answer(api.response, version, peek.correlation_id,
                                 {api.out_field: results}))

        def merged(rmsg: Msg) -> Msg:
            merge(api, rmsg, results)
            return rmsg

        return Forward(_reencode(body, head, end, api.request, version, msg), version,
                       _merging(api.response, merged))

    def _split(self, conn: ConnectionState, peek: RequestPeek, body: memoryview, head: int,
               end: int, msg: Msg, denied: list[Need]) -> RequestDecision:
        """The data APIs (``acl_partitions``): denied topics' partitions (batched
        OffsetFetch: denied groups) answered here, the rest forwarded, both merged."""
        version, api = peek.api_version, APIS[peek.api_key]
        layout = api.layout
        assert layout is not None

        def allowed(topic: str) -> bool:
            return self.allowed(conn, Need(layout.operation, "topic", topic))

        plan = split(layout, msg, version, *_names(denied), allowed)
        if plan is None:
            return None
        if not plan.left:
            return Answer(answer(api.response, version, peek.correlation_id, plan.merged(None)))
        sent = _reencode(body, head, end, api.request, version, msg) if plan.changed \
            else bytes(body)
        return Forward(sent, version, _merging(api.response, plan.merged))

    def _listing(self, conn: ConnectionState, body: memoryview, version: int,
                 listing: Listing) -> RequestDecision:
        """The response keeps what the principal may see (ListGroups)."""
        if listing.unless is not None and self.allowed(conn, listing.unless):
            return None

        def kept(msg: Msg) -> Msg:
            keep(listing, msg, lambda need: self.allowed(conn, need))
            return msg

        return Forward(bytes(body), version, _merging(listing.response, kept))

    # ------------------------------------------------------------------ responses

    def on_response(self, conn: ConnectionState, api_key: int, api_version: int,
                    body: memoryview) -> bytes | None:
        if api_key != api_keys.API_VERSIONS:
            return None
        spec = DECODED[api_keys.API_VERSIONS].response
        try:
            head, msg = _decode_response(spec, api_version, body)
        except CodecError:
            return None  # a v0 error answer (version unknown): it lists ApiVersions only
        offer_only(msg, offered)
        return _with_body(body, head, spec, api_version, msg)


def _merging(spec: MessageSpec, merge: Callable[[Msg], Msg]) -> Then:
    """A ``Forward.then`` that decodes the broker's response, merges, and encodes it."""
    def then(resp: memoryview, version: int) -> bytes:
        head, msg = _decode_response(spec, version, resp)
        return _with_body(resp, head, spec, version, merge(msg))
    return then


def _names(denied: list[Need]) -> tuple[frozenset[str], frozenset[str]]:
    """The denied topics and groups."""
    return (frozenset(n.name for n in denied if n.resource == "topic"),
            frozenset(n.name for n in denied if n.resource == "group"))


def _rank(need: Need) -> int:
    """Which error answers a request refused for several reasons: Kafka checks the
    transactional id, then the group, then topics."""
    return {"transactional_id": 0, "cluster": 1, "group": 2, "topic": 3}[need.resource]

