"""Property tests: every schema at every version round-trips through the interpreter."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.codecs import interpreter, skipping
from kproxy.codecs.primitives import Reader
from kproxy.codecs.registry import DECODED
from kproxy.codecs.schema import MessageSpec

from ..schema_strategies import message_strategy

SPECS: list[tuple[MessageSpec, int]] = [
    (spec, version)
    for api in DECODED.values()
    for spec in (api.request, api.response)
    if spec is not None
    for version in range(spec.valid.lo, spec.valid.hi + 1)
]


def test_every_decoded_api_and_version_is_covered() -> None:
    names = {spec.name for spec, _ in SPECS}
    assert {"MetadataRequest", "MetadataResponse", "ApiVersionsResponse",
            "FindCoordinatorResponse", "DescribeClusterResponse", "PushTelemetryRequest",
            "GetTelemetrySubscriptionsResponse", "FetchResponse", "ProduceResponse"} <= names
    assert sum(1 for spec, _ in SPECS if spec.name == "MetadataResponse") == 14  # v0..v13


@pytest.mark.parametrize(("spec", "version"), SPECS, ids=lambda x: getattr(x, "name", x))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_encode_decode_roundtrip(spec: MessageSpec, version: int, data: st.DataObject) -> None:
    msg = data.draw(message_strategy(spec, version))
    wire = interpreter.encode(spec, version, msg)
    decoded = interpreter.decode(spec, version, wire)
    assert decoded == msg
    assert interpreter.encode(spec, version, decoded) == wire
    # skip() walks exactly the same bytes without building anything.
    r = Reader(wire)
    skipping.skip(spec, version, r)
    assert r.pos == len(wire)


@pytest.mark.parametrize(("spec", "version"), SPECS, ids=lambda x: getattr(x, "name", x))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_opaque_fields_are_skipped_and_copied_back_byte_for_byte(
        spec: MessageSpec, version: int, data: st.DataObject) -> None:
    msg = data.draw(message_strategy(spec, version))
    wire = interpreter.encode(spec, version, msg)
    full = interpreter.decode(spec, version, wire)
    names = sorted(f.name for f in spec.body.fields)
    chosen = frozenset(data.draw(st.sets(st.sampled_from(names)))) if names else frozenset()
    partial = interpreter.decode(spec, version, wire, chosen)
    assert interpreter.encode(spec, version, partial) == wire
    assert partial.keys() == full.keys()
    for name, value in partial.items():
        if isinstance(value, interpreter.Opaque):
            assert name in chosen
        else:
            assert value == full[name]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_opaque_metadata_topics_cross_the_v12_to_v13_bridge_unchanged(
        data: st.DataObject) -> None:
    from kproxy.policies.rewrite import METADATA_OPAQUE

    spec = DECODED[3].response
    assert spec is not None
    msg = data.draw(message_strategy(spec, 12))
    wire = interpreter.encode(spec, 12, msg)
    full = {**interpreter.decode(spec, 12, wire), "error_code": 129}
    partial = {**interpreter.decode(spec, 12, wire, METADATA_OPAQUE), "error_code": 129}
    assert isinstance(partial["topics"], interpreter.Opaque)
    assert interpreter.encode(spec, 13, partial) == interpreter.encode(spec, 13, full)
