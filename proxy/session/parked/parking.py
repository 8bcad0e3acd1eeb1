"""Idle connections without a task of their own: the parking lot waits for all of them.

A session waiting for its client's next request holds two trio tasks (the request side
and the response side), a nursery, the coroutine frames they wait in and trio's wait
state for each socket: about 8 KB of the 13 KB an idle connection pair used to cost. A
*parked* session keeps its sockets and its state and holds no task: its descriptors sit
in the lot's own epoll, whose one descriptor the lot waits on through trio. Whatever
would have woken the session starts its run again in the proxy's connection nursery:
either socket readable (bytes, the end of the stream, an error), its idle deadline, or
a control (a drain, its backend gone, a close).

When to park is decided here, off the relay path. A session says it has nothing in flight
(``note_idle``: a set insertion); every ``SWEEP_S`` the lot asks those idle for
``PARK_AFTER_S`` to park. The session checks at its own wait that parking is safe
(``Session.park_if_idle``) and parks. A busy connection never parks; it pays the set
insertion.

System calls are what a park and a wake-up cost most (on a virtual machine, more than
the Python around them), so there are few: a parked descriptor is registered one-shot
and stays registered while its socket lives (re-armed at each park, the one that did
not fire disarmed at the wake-up), and the timer is a task of its own, so that sweeps
and deadlines never disturb the wait on the epoll. While the express lane runs, a
parked descriptor is level-triggered instead (``_LANE_ARMED``), so the lane relays
request after request without re-arming.

Deadlines: parked sessions in a heap by their last activity (the idle timeout is the
same for every connection and read from the configuration each time, so a reload
applies); entries of sessions that woke meanwhile are skipped, and dropped in bulk
when they outnumber the live ones. An entry names its session by descriptor and park,
not by reference, so that a stale one does not keep an ended session alive. A
session the express lane relays for stays parked and its activity moves on without a
new entry: when its entry comes due, it is put back at its latest activity (one heap
operation per idle timeout, not per request).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import select
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import trio

from kproxy.session.parked.express import BACKOFF_S, MIN_RUN, ExpressLane

if TYPE_CHECKING:
    from kproxy.session.session import Session

log = logging.getLogger("kproxy.session")

# Idle this long (nothing in flight, no complete frame either way) before a session parks.
# A park and its wake-up cost about as much CPU as relaying a small request (see
# docs/architecture.md): a client asking less often than this pays that at most once
# per request; a busy one never. Kafka clients' idle connections (metadata refreshes
# every few minutes, heartbeats every few seconds) park between their requests. Longer
# lets a burst of new connections all be active at once: at 0.5 s, 1,000 connections
# opened together left the proxy 7.1-7.5 MB larger, at 0.25 s 5.1-5.6 MB.
PARK_AFTER_S = 0.25
# How often the lot looks at the sessions that said they were idle.
SWEEP_S = 0.1

_ARMED = select.EPOLLIN | select.EPOLLONESHOT
_DISARMED = select.EPOLLONESHOT  # registered, reporting nothing (but errors, once)
# While the express lane runs, a parked descriptor is level-triggered instead: the lane
# relays from it request after request, and a one-shot registration would cost an
# ``epoll_ctl`` to re-arm after each. The lane disarms a session's descriptors itself
# when it hands the session back (rarely), so that they stop reporting before trio runs it.
_LANE_ARMED = select.EPOLLIN


class ParkingLot:
    """Every parked session's sockets in one epoll; ``run`` waits for them."""

    def __init__(self, idle_timeout: Callable[[], float], express_lane: bool = False) -> None:
        self._idle_timeout = idle_timeout  # read each time: a reload applies
        self._express_lane = express_lane
        self._lane: ExpressLane | None = None  # while it runs
        self._token: trio.lowlevel.TrioToken | None = None
        self._epoll: select.epoll | None = None
        self._nursery: trio.Nursery | None = None
        self._by_fd: dict[int, Session] = {}  # both descriptors of each parked session
        self._parked = 0
        # (last activity when parked, the park's number, the session's first descriptor);
        # stale once the session woke: the descriptor then names no session parked under
        # that number.
        self._deadlines: list[tuple[float, int, int]] = []
        self._order = itertools.count()
        self._noted: set[Session] = set()  # said idle since the last sweep
        self._next_sweep = math.inf
        self._timer: trio.CancelScope | None = None  # the timer's sleep, while it sleeps

    def __len__(self) -> int:
        return self._parked

    # ------------------------------------------------------------------ the tasks

    async def run(self, nursery: trio.Nursery) -> None:
        """Wait for parked sessions until cancelled; woken ones run in ``nursery``.
        Cancelled (the proxy is stopping), it closes the sessions still parked."""
        self._epoll = epoll = select.epoll()
        self._nursery = nursery
        try:
            async with trio.open_nursery() as own:
                own.start_soon(self._run_timer)
                if self._express_lane:
                    # The lane's thread waits on the epoll instead (kproxy.session.parked.express).
                    self._token = trio.lowlevel.current_trio_token()
                    self._lane = ExpressLane(epoll, self._ready_in_lane)
                    await self._lane.run()
                while True:
                    await trio.lowlevel.wait_readable(epoll.fileno())
                    for fd, _ in epoll.poll(0):
                        session = self._by_fd.get(fd)
                        if session is not None:  # its other socket may have woken it
                            self.wake(session, fd)
        finally:
            self._lane = self._token = None
            self._nursery = self._timer = None
            for session in self._sessions():
                self._forget(session)
                session.parked = False
                try:
                    session.abandon()
                except Exception:  # one session's report must not keep the others open
                    log.exception("internal error closing a parked session")
            self._noted.clear()
            self._deadlines = []
            self._parked = 0
            self._epoll = None
            epoll.close()

    @property
    def lane_running(self) -> bool:
        return self._lane is not None

    def _ready_in_lane(self, fd: int, now: float) -> None:
        """In the lane's thread, on its turn: ``fd`` of a parked session is readable.
        The lane relays what it can and the descriptor is armed again, or the session is
        handed back to trio. Nothing here calls trio but through the token."""
        session = self._by_fd.get(fd)
        if session is None or session.handing_back:
            return  # a session that woke meanwhile
        assert self._epoll is not None and self._token is not None
        try:
            if session.lane_step(fd, now):
                return  # still armed; its idle deadline is checked when due
        except Exception:  # the session runs again, and its tasks report what is wrong
            log.exception("internal error relaying in the express lane")
        self._disarm(session.parking_fds())  # level-triggered: else they keep reporting
        session.handing_back = True
        self._token.run_sync_soon(self._hand_back, session, fd)

    def _hand_back(self, session: Session, fd: int) -> None:
        """In trio: run a session the express lane could not relay, as a wake-up would;
        after short runs in the lane, it parks at once again only after
        ``express.BACKOFF_S``."""
        session.handing_back = False
        session.services.metrics.lane.handbacks += 1
        # Two short runs in a row: its requests need trio (a producer's large batches),
        # not once in a while (a telemetry request among small ones).
        session.lane_short = session.lane_short + 1 if session.lane_run < MIN_RUN else 0
        if session.lane_short >= 2:
            session.lane_after = trio.current_time() + BACKOFF_S
        session.lane_run = 0
        if not session.parked or self._nursery is None:
            return
        if session.lane_eof and session.lane_failed is None and session.catch_up is None:
            # The client left (the usual end of a short connection): closed here, as
            # its tasks would on reading the end of the stream, without starting them.
            self._unpark(session)
            session.abandon("client closed the connection")
            return
        self.wake(session, fd, disarmed=True)

    async def _run_timer(self) -> None:
        """Sweep the sessions noted idle; wake those whose idle deadline passed."""
        while True:
            with trio.CancelScope(deadline=self._wake_at()) as self._timer:
                await trio.sleep_forever()
            self._timer = None
            now = trio.current_time()
            self._wake_expired(now)
            if now >= self._next_sweep:
                self._sweep(now)

    def _wake_at(self) -> float:
        """The earliest idle deadline of a parked session, or the next sweep."""
        timeout = self._idle_timeout()
        first = self._deadlines[0][0] + timeout if self._deadlines and timeout else math.inf
        return min(first, self._next_sweep)

    def _wake_expired(self, now: float) -> None:
        timeout = self._idle_timeout()
        if not timeout:
            return
        heap = self._deadlines
        while heap and heap[0][0] + timeout <= now:
            last, order, fd = heapq.heappop(heap)
            session = self._by_fd.get(fd)
            if session is None or session.park_order != order:
                continue  # it woke since: the entry is stale
            if session.last_activity == last:
                self.wake(session)  # it finds its idle timeout passed, and closes
            else:  # the express lane relayed for it meanwhile: its deadline moved on
                heapq.heappush(heap, (session.last_activity, order, fd))

    def _sooner(self) -> None:
        """Something earlier to do: the timer recomputes when to wake."""
        if self._timer is not None:
            self._timer.deadline = self._wake_at()

    # ------------------------------------------------------------------ parking

    def note_idle(self, session: Session) -> None:
        """``session`` has nothing in flight: look at it at the next sweeps."""
        if not self._noted:
            self._next_sweep = trio.current_time() + SWEEP_S
            self._sooner()
        self._noted.add(session)

    def _sweep(self, now: float) -> None:
        """Ask the sessions idle for ``PARK_AFTER_S`` to park; forget the busy ones (they
        are noted again when they next have nothing in flight)."""
        noted = self._noted
        for session in list(noted):
            if len(session.ordered) or session.ended:
                noted.discard(session)
            elif now - session.last_activity >= PARK_AFTER_S:
                noted.discard(session)
                session.park_if_idle()
        self._next_sweep = now + SWEEP_S if noted else math.inf

    def park(self, session: Session) -> bool:
        """Hold ``session``'s sockets until one is readable or its deadline passes;
        False when the lot is not running (the session then ends as it would have)."""
        epoll = self._epoll
        if epoll is None:
            return False
        armed = _LANE_ARMED if self._lane is not None else _ARMED
        fds = session.parking_fds()
        try:
            for fd in fds:
                self._by_fd[fd] = session
                try:
                    epoll.modify(fd, armed)
                except FileNotFoundError:  # its first park (a closed socket's went with it)
                    epoll.register(fd, armed)
        except OSError:
            log.exception("could not park a session; closing it")
            self._forget(session)
            return False
        session.parked = True
        session.park_order = order = next(self._order)
        self._parked += 1
        heapq.heappush(self._deadlines, (session.last_activity, order, fds[0]))
        self._drop_stale()
        self._sooner()
        return True

    def wake(self, session: Session, readable: int = -1, disarmed: bool = False) -> None:
        """Start ``session``'s run again (it was parked): a socket is readable (the
        descriptor ``readable``, which its one-shot registration disarmed), its
        deadline passed, or a control reached it. ``disarmed``: the lane disarmed
        both descriptors already."""
        assert self._epoll is not None and self._nursery is not None
        held = self._unpark(session)
        if not disarmed:
            # A level-triggered descriptor (the lane's) reports until disarmed, the
            # readable one too; a one-shot one that fired is disarmed already.
            self._disarm([fd for fd in held if fd != readable or self._lane is not None])
        self._nursery.start_soon(session.resume, readable,
                                 name="kproxy.session.session.Session.resume")

    def _unpark(self, session: Session) -> list[int]:
        """``session`` leaves the lot (to run again, or to close); its descriptors."""
        held = self._forget(session)
        session.parked = False
        self._parked -= 1
        self._drop_stale()
        return held

    def _disarm(self, fds: Iterable[int]) -> None:
        assert self._epoll is not None
        for fd in fds:
            try:
                self._epoll.modify(fd, _DISARMED)
            except OSError:  # the session ends over it, or already has
                log.debug("could not disarm a parked session's descriptor")

    def reconfigured(self) -> None:
        """The idle timeout may have changed."""
        self._sooner()

    def _forget(self, session: Session) -> list[int]:
        """Drop ``session``'s descriptors from the table; the ones it had there."""
        held = [fd for fd in session.parking_fds() if self._by_fd.get(fd) is session]
        for fd in held:
            del self._by_fd[fd]
        return held

    def _sessions(self) -> list[Session]:
        """Each parked session once."""
        return [s for fd, s in self._by_fd.items() if fd == s.parking_fds()[0]]

    def _drop_stale(self) -> None:
        """Rebuild the heap when entries of sessions that woke outnumber the parked ones:
        amortised, a constant per park."""
        if len(self._deadlines) > 2 * self._parked + 64:
            self._deadlines = [(s.last_activity, s.park_order, s.parking_fds()[0])
                               for s in self._sessions()]
            heapq.heapify(self._deadlines)
