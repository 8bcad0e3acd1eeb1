"""After a push refused as INVALID_RECORD, that connection's telemetry is held a while.

A client takes INVALID_RECORD as the end of its telemetry, so the next telemetry
request on the same connection is not a KIP-714 client's: it waits out the hold and is
refused with THROTTLING_QUOTA_EXCEEDED, and nothing of it is decoded or vetted. Other
connections never wait. The bomb goes through the real vetting helper.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from typing import Any, cast

import trio

from kproxy.codecs import api_keys
from kproxy.codecs.messages import decode_response
from kproxy.codecs.peek import peek_request
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.connection import ClientInfo, ConnectionState
from kproxy.policies.telemetry import state as policy
from kproxy.telemetry.service import TelemetryService

from ..hostile_pusher import bomb
from ..support import encode_request, make_config, push_body

HOLD_MS = 400
INVALID_RECORD = policy.INVALID_RECORD
THROTTLED = policy.THROTTLING_QUOTA_EXCEEDED


class Conn:
    """What the telemetry handlers read and write of a connection."""

    def __init__(self, port: int) -> None:
        self.info = ClientInfo("127.0.0.1", port, "app", "librdkafka", "2.5.0")
        self.telemetry_held_until = 0

    def log_fields(self) -> dict[str, object]:
        return {}


class Client:
    """One connection's telemetry requests, made the way the relay calls the handlers."""

    def __init__(self, service: TelemetryService, port: int) -> None:
        self.service, self.conn, self.corr = service, Conn(port), 0

    def _frame(self, api_key: int, body: dict[str, Any]) -> memoryview:
        self.corr += 1
        return memoryview(encode_request(api_key, 0, self.corr, body)[4:])

    def get(self) -> bytes | Awaitable[bytes]:
        frame = self._frame(api_keys.GET_TELEMETRY_SUBSCRIPTIONS,
                            {"client_instance_id": uuid.UUID(int=0)})
        return self.service.handle_get(cast(ConnectionState, self.conn), peek_request(frame),
                                       frame)

    def push(self, got: dict[str, Any], metrics: bytes) -> bytes | Awaitable[bytes]:
        frame = self._frame(api_keys.PUSH_TELEMETRY, push_body(got, metrics, 4))
        return self.service.handle_push(cast(ConnectionState, self.conn),
                                        peek_request(frame), frame)


def body(answer: bytes, api_key: int) -> dict[str, Any]:
    return decode_response(answer, api_key, 0).body


def service(hold_ms: int = HOLD_MS) -> TelemetryService:
    cfg = make_config("127.0.0.1:1", telemetry_refused_push_hold_ms=hold_ms)
    return TelemetryService(cfg.telemetry, ProxyMetrics())


def vetted(svc: TelemetryService) -> float:
    counter = svc.counts.vetted
    return sum(float(counter.labels(v)._value.get()) for v in ("passed", "refused", "none"))


def held(svc: TelemetryService, api: str) -> float:
    return float(svc.hold.held.labels(api)._value.get())


async def refused_bomb(client: Client) -> None:
    """A fresh instance, then a bomb on it: refused as INVALID_RECORD."""
    got = client.get()
    assert isinstance(got, bytes)
    answer = client.push(body(got, api_keys.GET_TELEMETRY_SUBSCRIPTIONS), bomb())
    assert not isinstance(answer, bytes)  # paced: vetted by the helper
    assert body(await answer, api_keys.PUSH_TELEMETRY)["error_code"] == INVALID_RECORD


async def test_a_connections_telemetry_after_a_refused_push_waits_and_is_refused() -> None:
    svc = service()
    hostile, other = Client(svc, 5000), Client(svc, 5001)
    try:
        await refused_bomb(hostile)
        refused_at = trio.current_time()
        vetted_before = vetted(svc)
        # The next Get on that connection waits out the hold, then is refused.
        pending = hostile.get()
        assert not isinstance(pending, bytes)
        # Meanwhile another connection's telemetry is answered at once.
        got = other.get()
        assert isinstance(got, bytes)
        assert body(got, api_keys.GET_TELEMETRY_SUBSCRIPTIONS)["error_code"] == 0
        answer = body(await pending, api_keys.GET_TELEMETRY_SUBSCRIPTIONS)
        assert answer["error_code"] == THROTTLED
        assert 0 < answer["throttle_time_ms"] <= HOLD_MS
        assert trio.current_time() - refused_at >= answer["throttle_time_ms"] / 1000 - 0.002
        assert answer["client_instance_id"] == uuid.UUID(int=0)  # no instance made
        assert held(svc, "GetTelemetrySubscriptions") == 1
        # Once the hold is out the connection is served as any other.
        got = hostile.get()
        assert isinstance(got, bytes)
        fresh = body(got, api_keys.GET_TELEMETRY_SUBSCRIPTIONS)
        assert fresh["error_code"] == 0
        # A push within a new hold is refused the same way, and never vetted.
        await refused_bomb(hostile)
        pending = hostile.push(fresh, bomb())
        assert not isinstance(pending, bytes)
        answer = body(await pending, api_keys.PUSH_TELEMETRY)
        assert answer["error_code"] == THROTTLED
        assert 0 < answer["throttle_time_ms"] <= HOLD_MS
        assert held(svc, "PushTelemetry") == 1
        assert vetted(svc) == vetted_before + 1  # the second bomb only
    finally:
        await svc.vetting.aclose()


async def test_pushes_already_queued_when_one_is_refused_are_not_vetted() -> None:
    """Bombs sent back to back without waiting for answers: the first refused pushes'
    successors on that connection are refused without a verdict."""
    svc = service()
    client = Client(svc, 5000)
    try:
        answers = []
        for _ in range(3):
            got = client.get()
            assert isinstance(got, bytes)  # not held yet: nothing was refused
            answers.append(client.push(body(got, api_keys.GET_TELEMETRY_SUBSCRIPTIONS),
                                       bomb()))
        codes = []
        for answer in answers:
            assert not isinstance(answer, bytes)
            codes.append(body(await answer, api_keys.PUSH_TELEMETRY)["error_code"])
        assert codes == [INVALID_RECORD, THROTTLED, THROTTLED]
        assert vetted(svc) == 1
    finally:
        await svc.vetting.aclose()


async def test_with_the_hold_off_each_bomb_is_vetted_and_nothing_waits() -> None:
    svc = service(hold_ms=0)
    client = Client(svc, 5000)
    try:
        for _ in range(2):
            await refused_bomb(client)
        assert client.conn.telemetry_held_until == 0
        assert vetted(svc) == 2
    finally:
        await svc.vetting.aclose()
