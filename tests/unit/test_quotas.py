"""Quotas per principal: the configuration, the windowed rate, the throttle arithmetic,
and the throttle_time_ms rewrite (checked with kio, an independent codec)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from kproxy.config import settings as config_mod
from kproxy.policies.auth.quotas import (
    FETCH,
    PRODUCE,
    REQUEST,
    QuotaError,
    Quotas,
    Rate,
    parse_quotas,
    set_throttle,
)

ALICE = "User:alice"


def _quotas(entries: list[dict[str, Any]], **kw: Any) -> Quotas:
    return Quotas(parse_quotas(entries), **kw)


def test_entries_parse_and_the_default_applies_to_others() -> None:
    q = _quotas([{"principal": ALICE, "produce_bytes_per_second": 1000},
                 {"principal": "*", "requests_per_second": 50}])
    assert q.quota(ALICE, PRODUCE) == 1000 and q.quota(ALICE, REQUEST) is None
    assert q.quota("User:bob", REQUEST) == 50 and q.quota("User:bob", FETCH) is None
    assert q.quota(None, REQUEST) == 50  # no principal: User:ANONYMOUS, under the default
    assert q.quota("alice", PRODUCE) == 1000  # a login names "alice", Kafka "User:alice"
    assert _quotas([{"principal": "User:ANONYMOUS", "requests_per_second": 3}]).quota(
        None, REQUEST) == 3
    assert not Quotas().enabled and q.enabled


@pytest.mark.parametrize(("entries", "key"), [
    ({"principal": ALICE}, "quotas[0]: sets no limit"),
    ({"produce_bytes_per_second": 1}, "quotas[0].principal"),
    ({"principal": ALICE, "produce_bytes_per_second": 0}, "quotas[0].produce_bytes_per_second"),
    ({"principal": ALICE, "fetch_bytes_per_second": "fast"}, "quotas[0].fetch_bytes_per_second"),
    ({"principal": ALICE, "request_percentage": 10}, "quotas[0].request_percentage: not offered"),
    ({"principal": ALICE, "produce_byte_rate": 10}, "quotas[0].produce_byte_rate: unknown key"),
])
def test_bad_entries_name_the_key(entries: dict[str, Any], key: str) -> None:
    with pytest.raises(QuotaError, match=key.replace("[", r"\[").replace(".", r"\.")):
        parse_quotas([entries])


def test_a_principal_twice_is_refused() -> None:
    with pytest.raises(QuotaError, match=r"quotas\[1\]\.principal"):
        parse_quotas([{"principal": "alice", "requests_per_second": 1},
                      {"principal": "User:alice", "requests_per_second": 2}])


def test_rate_is_measured_over_at_least_samples_minus_one() -> None:
    rate = Rate(samples=11, sample_s=1.0)
    rate.record(1000, 100.0)
    assert rate.rate(100.0) == (100.0, 10.0)  # a first burst over the 10 s floor
    for t in range(101, 131):
        rate.record(1000, float(t))
    observed, window = rate.rate(130.5)
    assert window == pytest.approx(10.5) and observed == pytest.approx(11000 / 10.5)


def test_throttle_is_the_overshoot_over_the_window_bounded() -> None:
    q = _quotas([{"principal": ALICE, "produce_bytes_per_second": 100}],
                samples=3, sample_s=1.0)
    assert q.record(ALICE, PRODUCE, 200, 0.0) == 0.0  # 200 over the 2 s floor: at quota
    # 400 over 2 s = 200/s, double the quota: (200 - 100) / 100 * 2 s
    assert q.record(ALICE, PRODUCE, 200, 0.5) == pytest.approx(2.0)
    assert q.record(ALICE, PRODUCE, 10**9, 0.6) == 3.0  # bounded by the whole window
    assert q.record("User:bob", PRODUCE, 10**9, 0.6) == 0.0  # no quota of his own


def test_share_divides_each_quota_among_workers() -> None:
    q = _quotas([{"principal": ALICE, "requests_per_second": 10}], samples=2)
    q.share = 2
    assert q.quota(ALICE, REQUEST) == 5
    throttles = [q.record(ALICE, REQUEST, 1, 0.0) for _ in range(6)]
    assert throttles[4] == 0.0 and throttles[5] > 0  # the 6th in 1 s exceeds 5/s


def test_state_is_bounded_and_survives_a_reload() -> None:
    q = _quotas([{"principal": "*", "requests_per_second": 1}], max_principals=100)
    for i in range(500):
        q.record(f"User:u{i}", REQUEST, 1, 0.0)
    assert q.tracked() <= 300
    q.record(ALICE, REQUEST, 5, 0.0)
    q.reconfigure(parse_quotas([{"principal": "*", "requests_per_second": 2}]), 11, 1.0)
    assert q.record(ALICE, REQUEST, 20, 0.1) > 0  # the 5 before the reload still count
    q.reconfigure((), 11, 1.0)
    assert not q.enabled and q.record(ALICE, REQUEST, 10**6, 0.2) == 0.0


# ----------------------------------------------------------------------------- the field


def _kio_response(entity: Any, header: Any) -> bytes:
    import io

    from kio.serial import entity_writer

    buf = io.BytesIO()
    entity_writer(type(header))(buf, header)
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def _kio_read(module: Any, cls: str, header_cls: Any, data: bytes) -> Any:
    from kio.serial import entity_reader

    view = memoryview(data)
    _, at = entity_reader(header_cls)(view, 0)
    out, size = entity_reader(getattr(module, cls))(view, at)
    assert at + size == len(data)
    return out


def _ms(n: int) -> Any:
    from kio.static.primitive import i32Timedelta

    return i32Timedelta.parse(datetime.timedelta(milliseconds=n))


@pytest.mark.parametrize("version", [7, 10])
def test_produce_throttle_time_is_rewritten(version: int) -> None:
    import importlib

    from kio.schema.errors import ErrorCode
    from kio.static.primitive import i32, i64

    m = importlib.import_module(f"kio.schema.produce.v{version}.response")
    header_mod = importlib.import_module(
        f"kio.schema.response_header.v{1 if version >= 9 else 0}.header")
    header = header_mod.ResponseHeader(correlation_id=i32(42))
    part: dict[str, Any] = {"index": i32(0), "error_code": ErrorCode(0),
                            "base_offset": i64(5)}
    if version >= 8:
        part |= {"record_errors": (), "error_message": None}
    extra: dict[str, Any] = {}
    if version >= 10:  # a tagged NodeEndpoints after the field: the walk must stop before it
        extra["node_endpoints"] = (m.NodeEndpoint(node_id=i32(1), host="h", port=i32(9),
                                                  rack=None),)
    resp = m.ProduceResponse(responses=(m.TopicProduceResponse(
        name="t", partition_responses=(m.PartitionProduceResponse(**part),)),),
        throttle_time=_ms(7), **extra)
    raw = _kio_response(resp, header)
    patched = set_throttle(0, version, memoryview(raw), 1234)
    assert patched is not None and len(patched) == len(raw)
    again = _kio_read(m, "ProduceResponse", header_mod.ResponseHeader, patched)
    assert again.throttle_time == _ms(1234)
    assert again.responses == resp.responses
    # The broker's own, longer throttle is kept.
    assert set_throttle(0, version, memoryview(raw), 3) == raw


@pytest.mark.parametrize("version", [4, 12])
def test_fetch_throttle_time_is_rewritten(version: int) -> None:
    import importlib

    from kio.schema.errors import ErrorCode
    from kio.static.primitive import i32

    m = importlib.import_module(f"kio.schema.fetch.v{version}.response")
    header_mod = importlib.import_module(
        f"kio.schema.response_header.v{1 if version >= 12 else 0}.header")
    header = header_mod.ResponseHeader(correlation_id=i32(9))
    kwargs: dict[str, Any] = {"throttle_time": _ms(0), "responses": ()}
    if version >= 7:
        kwargs |= {"error_code": ErrorCode(0), "session_id": i32(0)}
    raw = _kio_response(m.FetchResponse(**kwargs), header)
    patched = set_throttle(1, version, memoryview(raw), 500)
    assert patched is not None
    assert _kio_read(m, "FetchResponse", header_mod.ResponseHeader,
                     patched).throttle_time == _ms(500)


def test_no_field_no_rewrite() -> None:
    assert set_throttle(0, 0, b"\x00" * 20, 100) is None  # Produce v0 has none
    assert set_throttle(3, 12, b"\x00" * 20, 100) is None  # Metadata: not rewritten
    assert set_throttle(0, 7, b"\x00\x00", 100) is None  # truncated: left alone


# ----------------------------------------------------------------------------- config


def test_config_reads_quotas_and_names_a_bad_key(tmp_path: Path) -> None:
    path = tmp_path / "kproxy.toml"
    path.write_text('quota_window_samples = 5\n[[quotas]]\nprincipal = "User:alice"\n'
                    'produce_bytes_per_second = 204800\n')
    cfg = config_mod.load(config_mod_args("--config", str(path)), env={})
    assert cfg.quotas[0].principal == "alice" and cfg.quota_window_samples == 5
    path.write_text('[[quotas]]\nprincipal = "User:alice"\nproduce_bytes_per_second = -1\n')
    with pytest.raises(config_mod.ConfigError,
                       match=r"quotas\[0\]\.produce_bytes_per_second: must be a number"):
        config_mod.load(config_mod_args("--config", str(path)), env={})


def config_mod_args(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    config_mod.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_fetch_relayed_as_it_arrives_gets_the_field_in_its_head() -> None:
    """Splice and cut-through hand the writer the first bytes held, then the rest: the
    field (first in a Fetch response) is set in those first bytes."""
    import struct

    from kproxy.session.inflight import Slot
    from kproxy.session.throttle import head_parts

    body = struct.pack(">i", 9) + b"\x00" + struct.pack(">ihi", 0, 0, 0) + b"\x01\x00"
    wire = struct.pack(">i", len(body) + 1000) + body  # 1000 bytes still to come
    slot = Slot(9, 1, 12, 0.0, upstream=True, throttle_ms=250)
    [head] = head_parts(slot, [memoryview(wire)])
    assert bytes(head[:4]) == wire[:4] and len(head) == len(wire)
    assert struct.unpack_from(">i", head, 4 + 4 + 1)[0] == 250
    slot.throttle_ms = 0
    assert head_parts(slot, [memoryview(wire)])[0] == memoryview(wire)
