"""The proxy's side of the vetting helper: one child process per proxy process.

``TelemetryService`` asks ``vet`` about each push it paces, before decoding it on the
loop: a push the helper refuses is answered without the loop walking it. The helper
starts at the first such push (most proxies never see one), is asked one push at a
time, and is started again when it has died (not sooner than ``RESTART_AFTER`` after
a failure). While it cannot be started, or when it fails on a push, the answer is
None: the push is decoded on the loop as it was before the helper existed, with the
same bounds, so the helper only ever saves work and never decides alone.

It runs in the kernel's idle class, so a verdict waits for a core with time to spare.
One that does not come within ``IdleTime.patience`` (its start included) means the
machine has none: the helper is stopped, the push decoded here, and while
``IdleTime`` backs off no push is sent to a helper (``idle_thread``).
"""

from __future__ import annotations

import logging
import subprocess
import sys

import trio

from kproxy.codecs.errors import CodecError
from kproxy.codecs.framing import FrameReader
from kproxy.codecs.otlp import vetting
from kproxy.telemetry.idle_thread import IDLE_TIME, IdleTime

log = logging.getLogger("kproxy.telemetry")
READ_CHUNK = 64 * 1024
RESTART_AFTER = 10.0  # seconds after a failure before another start: no spawn storm


class VettingProcess(trio.abc.AsyncResource):
    """A child ``kproxy.telemetry.vetting_child``, asked one push at a time; ``aclose``
    (or leaving ``async with``) stops it."""

    def __init__(self, command: list[str] | None = None, idle_time: IdleTime | None = None,
                 restart_after: float = RESTART_AFTER) -> None:
        self.command = command or [sys.executable, "-m", "kproxy.telemetry.vetting_child"]
        self.idle_time = idle_time or IDLE_TIME
        self.restart_after = restart_after
        self._proc: trio.Process | None = None
        # Helpers killed while starved: they exit when the kernel next runs them, which
        # no push waits for; reaped when found gone.
        self._dying: list[trio.Process] = []
        self._lock = trio.Lock()
        self._reader = FrameReader(vetting.MAX_VERDICT_BYTES)  # the running helper's
        self._failed_at: float | None = None
        self.started = 0  # helpers started, for tests and the log

    async def vet(self, request: vetting.VetRequest) -> vetting.Verdict | None:
        """The helper's verdict on ``request``; None when there is none to be had.

        The question is shielded from cancellation (bounded by the idle class's
        patience): a client that closes its connection mid-push must not cost a new
        helper.
        """
        async with self._lock:
            if not self.idle_time.available(trio.current_time()):
                return None  # no core has had time to spare lately
            proc = await self._running()
            if proc is None:
                return None
            verdict = None
            with trio.CancelScope(shield=True):
                try:
                    with trio.fail_after(self.idle_time.patience):
                        verdict = await self._ask(proc, request)
                    self.idle_time.served()
                except trio.TooSlowError:
                    self.idle_time.starved(trio.current_time(), "the telemetry vetting "
                                           "helper")
                    await self._abandon(proc)
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                        CodecError, EOFError) as exc:
                    log.warning("telemetry vetting helper failed; the push is decoded here",
                                extra={"fields": {"error": str(exc) or type(exc).__name__}})
                    self._failed_at = trio.current_time()
                    await self._stop(proc)
            return verdict

    async def _ask(self, proc: trio.Process, request: vetting.VetRequest) -> vetting.Verdict:
        assert proc.stdin is not None and proc.stdout is not None
        await proc.stdin.send_all(vetting.encode_request(request))
        while (body := self._reader.next_frame()) is None:
            chunk = await proc.stdout.receive_some(READ_CHUNK)
            if not chunk:
                raise EOFError("the vetting helper closed its output")
            self._reader.feed(chunk)
        return vetting.decode_verdict(body)

    async def _running(self) -> trio.Process | None:
        now = trio.current_time()
        if self._proc is not None:
            if self._proc.returncode is None:
                return self._proc
            log.warning("telemetry vetting helper exited",
                        extra={"fields": {"returncode": self._proc.returncode}})
            self._proc, self._failed_at = None, now
        if self._failed_at is not None and now - self._failed_at < self.restart_after:
            return None
        try:
            self._proc = await trio.lowlevel.open_process(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            self._failed_at = now
            log.warning("telemetry vetting helper did not start; pushes are decoded here",
                        extra={"fields": {"error": str(exc)}})
            return None
        self._reader = FrameReader(vetting.MAX_VERDICT_BYTES)
        self.started += 1
        return self._proc

    async def _stop(self, proc: trio.Process) -> None:
        """The helper ended: its input closed (it exits at once), killed if it lingers."""
        if self._proc is proc:
            self._proc = None
        with trio.CancelScope(shield=True):
            if proc.stdin is not None:
                await proc.stdin.aclose()
            with trio.move_on_after(2):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    async def _abandon(self, proc: trio.Process) -> None:
        """Kill a starved helper, with the question it owes an answer to, and go on: it
        would wait for idle time to read that its input closed, and to exit. Called
        within ``vet``'s shield."""
        if self._proc is proc:
            self._proc = None
        proc.kill()
        for stream in (proc.stdin, proc.stdout):  # closing our ends waits for nothing
            if stream is not None:
                await stream.aclose()
        self._dying.append(proc)
        self._dying = [p for p in self._dying if p.poll() is None]

    async def aclose(self) -> None:
        """Stop the running helper, if any; a later ``vet`` would start another."""
        if self._proc is not None:
            await self._stop(self._proc)
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            for proc in self._dying:
                await proc.wait()
