"""The vetting helper: its check and wire format, its main loop, and the proxy's side
of it with a real child process (a helper that fails is a real process too)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
from collections.abc import Callable

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.codecs import compression
from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import FrameReader, FrameTooLarge, frame
from kproxy.codecs.otlp import vetting
from kproxy.codecs.otlp.decode import DEFAULT_LIMITS, DecodeLimits
from kproxy.telemetry import vetting_child
from kproxy.telemetry.idle_thread import IdleTime
from kproxy.telemetry.vetting_process import VettingProcess

from ..hostile_pusher import bomb
from ..otlp_samples import librdkafka_like_payload
from ..support import busy_core

ZSTD = 4
MAX_DECOMPRESSED = 16 << 20


def request(payload: bytes, kind: int = ZSTD, limits: DecodeLimits = DEFAULT_LIMITS
            ) -> vetting.VetRequest:
    return vetting.VetRequest(kind, MAX_DECOMPRESSED, limits, payload)


def body(wire: bytes) -> bytes:
    """The one frame ``wire`` holds, whole."""
    reader = FrameReader()
    reader.feed(wire)
    (only,) = reader.frames()
    assert reader.buffered() == 0
    return only


# ---------------------------------------------------------------- the check


def test_a_bomb_is_refused_for_its_points_and_an_ordinary_push_passes() -> None:
    verdict = vetting.vet(request(bomb()))
    assert verdict.refusal is not None and verdict.refusal.limit_name == "points"
    assert "more than 10000 data points" in verdict.refusal.reason
    assert verdict.cpu_seconds > 0
    ordinary = compression.compress(ZSTD, librdkafka_like_payload())
    assert vetting.vet(request(ordinary)).refusal is None
    assert vetting.vet(request(librdkafka_like_payload(), kind=0)).refusal is None


def test_each_kind_of_refusal_names_its_bound_or_none() -> None:
    small = vetting.VetRequest(ZSTD, 1024, DEFAULT_LIMITS, bomb())
    refusal = vetting.vet(small).refusal
    assert refusal is not None and refusal.limit_name == "decompressed_bytes"
    few_metrics = DecodeLimits(max_metrics=1)
    refusal = vetting.vet(request(librdkafka_like_payload(), 0, few_metrics)).refusal
    assert refusal is not None and refusal.limit_name == "metrics"
    refusal = vetting.vet(request(b"\x0a\xff\xff", kind=0)).refusal  # a truncated field
    assert refusal is not None and refusal.limit_name == ""
    assert "truncated varint" in refusal.reason


# ---------------------------------------------------------------- the wire


def test_requests_and_verdicts_round_trip() -> None:
    limits = DecodeLimits(1, 2, 3, 4, 5, 6)
    sent = vetting.VetRequest(2, 12345, limits, b"payload")
    assert vetting.decode_request(body(vetting.encode_request(sent))) == sent
    for verdict in (vetting.Verdict(None, 0.25),
                    vetting.Verdict(vetting.Refused("too many", "points"), 0.5),
                    vetting.Verdict(vetting.Refused("malformed"), 0.0)):
        got = vetting.decode_verdict(body(vetting.encode_verdict(verdict)))
        assert got.cpu_seconds == verdict.cpu_seconds
        if verdict.refusal is None:
            assert got.refusal is None
        else:
            assert got.refusal is not None
            assert (got.refusal.reason, got.refusal.limit_name) == (
                verdict.refusal.reason, verdict.refusal.limit_name)
            assert vetting.limit_of(got.refusal) == verdict.refusal.limit_name


def test_a_verdict_cannot_name_a_bound_that_does_not_exist() -> None:
    forged = vetting.encode_verdict(vetting.Verdict(vetting.Refused("x", "made_up"), 0.1))
    with pytest.raises(CodecError, match="unknown bound"):
        vetting.decode_verdict(body(forged))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_the_wire_decoders_fail_only_with_codec_error(data: bytes) -> None:
    for decode in (vetting.decode_request, vetting.decode_verdict):
        with contextlib.suppress(CodecError):
            decode(data)


# ---------------------------------------------------------------- the helper's main loop


def pieces(data: bytes, size: int) -> Callable[[], bytes]:
    """``data`` as a pipe gives it: ``size`` bytes a read, then b"" (its end)."""
    stream = io.BytesIO(data)
    return lambda: stream.read(size)


def test_the_helper_answers_each_request_in_order_until_its_input_ends() -> None:
    asked = [request(bomb()), request(librdkafka_like_payload(), kind=0)]
    out = io.BytesIO()
    vetting_child.serve(pieces(b"".join(map(vetting.encode_request, asked)), 7), out,
                        vetting.MAX_REQUEST_BYTES)
    reader = FrameReader()
    reader.feed(out.getvalue())
    answers = [vetting.decode_verdict(body) for body in reader.frames()]
    assert reader.buffered() == 0
    assert [a.refusal is None for a in answers] == [False, True]


def test_the_helper_refuses_a_request_over_its_bound_and_stops_at_a_cut_one() -> None:
    with pytest.raises(FrameTooLarge, match="exceeds the limit of 100 bytes"):
        vetting_child.serve(pieces(frame(bytes(101)), 4096), io.BytesIO(), 100)
    out = io.BytesIO()
    vetting_child.serve(pieces(vetting.encode_request(request(bomb()))[:-3], 4096), out,
                        vetting.MAX_REQUEST_BYTES)
    assert out.getvalue() == b""


# ---------------------------------------------------------------- the proxy's side


# The helper's life (start, answers, failures, restarts), not the machine's idle time:
# these give it what a busy machine may take to run it (``IdleTime`` has its own tests).
PATIENT = IdleTime(patience=120.0)


async def test_a_real_helper_refuses_a_bomb_passes_a_push_and_is_started_once() -> None:
    async with VettingProcess(idle_time=PATIENT) as helper:
        refused = await helper.vet(request(bomb()))
        passed = await helper.vet(request(librdkafka_like_payload(), kind=0))
    assert refused is not None and refused.refusal is not None
    assert refused.refusal.limit_name == "points"
    assert passed is not None and passed.refusal is None
    assert helper.started == 1


async def test_a_helper_that_cannot_start_gives_no_verdict_and_is_not_retried_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    helper = VettingProcess(command=["/nonexistent/kproxy-helper"])
    with caplog.at_level("WARNING", logger="kproxy.telemetry"):
        assert await helper.vet(request(bomb())) is None
        assert await helper.vet(request(bomb())) is None
    starts = [r for r in caplog.records if "did not start" in r.getMessage()]
    assert len(starts) == 1  # the second push did not try again within restart_after


async def test_a_helper_that_answers_garbage_is_stopped_and_another_started_later() -> None:
    garbage = [sys.executable, "-c",
               "import sys; sys.stdin.buffer.read(4); "
               "sys.stdout.buffer.write(b'\\x7f' + b'\\xff' * 7); sys.stdout.flush()"]
    helper = VettingProcess(command=garbage, idle_time=PATIENT, restart_after=0.0)
    assert await helper.vet(request(bomb())) is None  # a verdict too long to be one
    helper.command = VettingProcess().command
    async with helper:
        verdict = await helper.vet(request(bomb()))
    assert verdict is not None and verdict.refusal is not None
    assert helper.started == 2


async def test_a_helper_that_dies_between_pushes_is_started_again() -> None:
    async with VettingProcess(idle_time=PATIENT, restart_after=0.0) as helper:
        assert await helper.vet(request(bomb())) is not None
        assert helper._proc is not None
        helper._proc.kill()
        await helper._proc.wait()
        verdict = await helper.vet(request(bomb()))
    assert verdict is not None and verdict.refusal is not None
    assert helper.started == 2


async def test_a_helper_too_slow_to_answer_is_stopped_and_none_is_asked_for_a_while() -> None:
    """Past the patience the helper is killed at once (it would read that its input
    closed only when it runs) and, while the idle class backs off, no push is sent to
    a helper at all: each gets no verdict without a wait."""
    mute = [sys.executable, "-c", "import time; time.sleep(60)"]
    idle = IdleTime(patience=0.5)
    helper = VettingProcess(command=mute, idle_time=idle)
    with trio.fail_after(20):
        assert await helper.vet(request(bomb())) is None
        assert helper._proc is None and idle.starvations == 1
        assert await helper.vet(request(bomb())) is None
    assert helper.started == 1 and idle.starvations == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
async def test_a_real_helper_on_a_core_with_no_time_to_spare_gives_way_after_its_patience(
        ) -> None:
    """A busy process at ordinary priority on the only core the helper may use: the
    helper, in the idle class, gets next to no time, so the push gets no verdict after
    the patience (it used to wait 30 s), and the same helper serves again once the
    core has time to spare."""
    idle = IdleTime(patience=1.0, first=0.0)
    # A push whose check takes the helper about a second of CPU: every point decoded.
    every_point = dataclasses.replace(DEFAULT_LIMITS, max_points=10_000_000)
    cpu = max(os.sched_getaffinity(0))
    # The real helper, on that core (trio starts it from a thread of its own: it would
    # not inherit this thread's mask).
    pinned = [sys.executable, "-c", f"import os, runpy; os.sched_setaffinity(0, {{{cpu}}}); "
              "runpy.run_module('kproxy.telemetry.vetting_child', run_name='__main__')"]
    async with VettingProcess(command=pinned, idle_time=idle) as helper:
        with busy_core(cpu), trio.fail_after(60):
            assert await helper.vet(request(bomb(), limits=every_point)) is None
            assert idle.starvations == 1 and helper._proc is None
        idle.patience = 120.0  # the core is free again, though the machine may be busy
        verdict = await helper.vet(request(bomb()))
    assert verdict is not None and verdict.refusal is not None
    assert helper.started == 2 and idle.starvations == 1


async def test_a_caller_cancelled_mid_question_leaves_the_helper_in_step() -> None:
    async with VettingProcess(idle_time=PATIENT) as helper:
        with trio.move_on_after(0.001):
            await helper.vet(request(bomb()))
        # The question was shielded: the helper is the same, and answers the next one.
        verdict = await helper.vet(request(librdkafka_like_payload(), kind=0))
    assert verdict is not None and verdict.refusal is None
    assert helper.started == 1
