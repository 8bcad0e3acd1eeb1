"""The admission channel between a worker and the supervisor, in one process.

Both real ends (``AdmissionControl`` and ``AdmissionHub``) over a real Unix socket
pair: a verdict that arrives after the worker gave up is undone, a supervisor that
does not answer leaves the decision to the worker's share, and a closed channel
too. Processes and SIGKILL are tests/e2e/test_global_admission.py's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.runtime import admission_control
from kproxy.runtime.admission_control import UNANSWERED, AdmissionControl
from kproxy.supervisor.admission_hub import AdmissionHub, Ledger, channel_pair


async def wait_for(check: Callable[[], object], what: str) -> None:
    with trio.move_on_after(10):
        while not check():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out waiting for: {what}")


async def test_answers_limits_and_a_late_admit_is_undone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_control, "ANSWER_TIMEOUT", 0.2)
    mine, theirs = channel_pair()
    hub = AdmissionHub(max_connections=100, max_per_source=2)
    ledger = hub.ledgers[0] = Ledger(0, 1)
    control = AdmissionControl(theirs, 2, ProxyMetrics())
    hub_sock = trio.socket.from_stdlib_socket(mine)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(control.run, 50)
        # The supervisor is not reading yet: the worker gives up and its share decides.
        assert await control.ask("10.0.0.1", 100, 2) == UNANSWERED
        assert control.share(100) == 50 and control.share(3) == 2
        serving = trio.CancelScope()

        async def serve() -> None:
            with serving:
                await hub._serve(ledger, hub_sock)

        nursery.start_soon(serve)
        # The late "admitted" for the request given up is released at once.
        await wait_for(lambda: ledger.fd_connections == 50 and hub.admitted_total == 1
                       and hub.open == 0, "the late admit undone")
        assert await control.ask("10.0.0.1", 100, 2) == "admitted"
        assert await control.ask("10.0.0.1", 100, 2) == "admitted"
        assert await control.ask("10.0.0.1", 100, 2) == "max_connections_per_source"
        control.release("10.0.0.1")
        await wait_for(lambda: hub.open == 1, "a release counted")
        # Admitted by the share alone: its release never reaches the supervisor.
        control.admitted_alone("10.0.0.1")
        control.release("10.0.0.1")
        assert control.unreported == {}
        await trio.sleep(0)
        assert hub.open == 1
        # A cancelled request leaks nothing either.
        with trio.move_on_after(0):
            await control.ask("10.0.0.2", 100, 2)
        await wait_for(lambda: hub.by_source.get(b"10.0.0.2", 0) == 0
                       and hub.admitted_total == 4, "the cancelled admit undone")
        # The supervisor goes away: every later request is the share's at once.
        serving.cancel()
        await trio.sleep(0)
        hub_sock.close()
        await wait_for(lambda: not control.connected, "the channel seen closed")
        with trio.fail_after(1):
            assert await control.ask("10.0.0.1", 100, 2) == UNANSWERED
        nursery.cancel_scope.cancel()
