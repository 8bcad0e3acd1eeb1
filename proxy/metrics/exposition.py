"""/metrics without stalling the relay: the exposition is produced in short slices.

A fleet's client telemetry can be hundreds of thousands of series; rendering them in
one go (prometheus_client's ``generate_latest``) held the event loop for seconds and
every connection with it. Here the proxy's own small families (every label bounded)
are rendered whole, and the large sources (the per-API families of
``kproxy.metrics.api_metrics``, client telemetry) hand out their series in small pieces,
rendered, and compressed, one slice of at most ``SLICE_SECONDS`` at a time with a
pause of ``REST_SECONDS`` in between, so a request arriving during a scrape waits at
most one slice, and the whole scrape, gzip included, takes at most about a fifth of
the core. What the loop does per series is kept small: a series' label text is made
once and kept (``kproxy.telemetry.exposition``), and no garbage collection runs
while the sources' big containers are alive (``_collector_paused``).

Why not a worker thread: rendering is pure Python and holds the GIL, so the loop
would wait for it up to the interpreter's switch interval (5 ms) at every wake-up,
for the whole scrape, and the sources are dicts the loop mutates. zlib does release
the GIL, and gzip ran on a thread until measured: on two cores the relay's p99
during scrapes was the same either way, while the thread's CPU was outside the
slices' budget and each chunk came back through the loop's wakeup socket. A piece
reads its series within one slice, so each series is consistent, and each source
copies what it iterates (see ``kproxy.telemetry.service``) so that changes between slices
cannot break the walk.

One scrape is produced at a time; a scrape arriving while one of the same format
is being produced shares its result, others queue.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import cast

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.utils import floatToGoString as _untyped_float_text

from kproxy.http.server import HttpResponse

log = logging.getLogger("kproxy")
# Longest the loop renders before letting connections run. A request that arrives
# during a slice waits for the rest of it (the express lane's thread cannot take the
# interpreter sooner), so the slice is what a scrape adds to the relay's p99: at 0.5 ms
# a producer's p99 of 0.35 ms read 0.85 ms during scrapes of 250,000 series, at 0.2 ms
# (and pieces of 32 rows) about 0.55 ms, for scrapes a quarter longer.
SLICE_SECONDS = 0.0002
# Pause after each slice: the scrape takes at most about a fifth of the core, so on
# a busy machine the kernel keeps treating the proxy as a light, mostly sleeping
# process and wakes it promptly for the relay (a process that renders flat out
# waits its turn behind every other busy process, and so would every connection).
# The loop's waits are whole milliseconds (epoll), so this rests about 1 ms.
REST_SECONDS = 0.0008
# Level 1: a third of level 5's CPU for about 15% more bytes (telemetry text is
# repetitive).
GZIP_LEVEL = 1
# Rendered text is deflated once this much is waiting: about 0.1 ms at level 1
# (telemetry text deflates at about 6 us per KB, slower than it renders), within a
# slice's budget.
ZIP_BYTES = 16 * 1024
_EOF = b"# EOF\n"


class YoungCollection:
    """A piece saying: collect the young generation here, if the walk paused the collector.

    A source yields it where what it made since is garbage or new for good and none of
    its big containers exist yet (telemetry's label text, made at a series' first
    scrape): collected in small doses between pieces, not all at once after the walk.
    """


COLLECT_YOUNG = YoungCollection()

# A piece: a metric family (rendered whole by prometheus_client: a small one, or a
# large one's header alone), sample lines already formatted (they read the same in
# both formats), ``COLLECT_YOUNG``, or None: nothing to write, but a good moment to
# let the loop run (a source copying its state in steps).
Piece = Metric | str | YoungCollection | None
PieceSource = Callable[[], Iterator[Piece]]


_float_text = cast(Callable[[float], str], _untyped_float_text)  # Prometheus' float text


def value_text(value: float) -> str:
    """A sample's value as Prometheus writes it (``floatToGoString``), the common case
    first: a float below 1e6 (and no infinity or NaN) reads the same as Python's repr,
    and costs a third."""
    if -math.inf < value < 1e6 and value.__class__ is float:
        return repr(value)
    return _float_text(value)


class _One:
    """A one-metric stand-in for a registry, for prometheus_client's renderers."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self.metric


@dataclass
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    response: HttpResponse | None = None


class Exposition:
    """Produces /metrics responses from a registry plus sources rendered in pieces."""

    def __init__(self, registry: CollectorRegistry, sources: list[PieceSource]) -> None:
        self.registry = registry
        self.sources = sources  # read at each scrape: telemetry adds its own later
        self._lock = trio.Lock()
        self._pending: dict[tuple[bool, bool], _Pending] = {}
        self.seconds = Gauge("kproxy_scrape_seconds", "Wall time the last /metrics "
                             "response took to produce", registry=registry)
        self.loop_seconds = Gauge("kproxy_scrape_longest_slice_seconds", "Longest the "
                                  "event loop was held in one slice of the last scrape "
                                  "(wall time: includes the process being preempted)",
                                  registry=registry)
        self.loop_cpu_seconds = Gauge("kproxy_scrape_longest_slice_cpu_seconds", "CPU time "
                                      "of the longest slice of the last scrape: what the "
                                      "scrape itself held the loop for", registry=registry)
        self.bytes = Gauge("kproxy_scrape_bytes", "Size of the last /metrics response as "
                           "sent (after gzip when asked)", registry=registry)
        self.scrapes = Counter("kproxy_scrapes", "/metrics responses produced (scrapes "
                               "that shared one are counted once)", registry=registry)

    async def response(self, headers: dict[str, str]) -> HttpResponse:
        key = ("application/openmetrics-text" in headers.get("accept", ""),
               "gzip" in headers.get("accept-encoding", ""))
        pending = self._pending.get(key)
        if pending is not None:  # one of the same kind is being produced: share it
            await pending.done.wait()
            return pending.response or HttpResponse(500, b"scrape failed\n")
        pending = self._pending[key] = _Pending()
        try:
            async with self._lock:
                pending.response = await self._produce(*key)
        except Exception:  # a collector's bug must not take the HTTP port down
            log.exception("producing /metrics failed")
            pending.response = HttpResponse(500, b"scrape failed; see the proxy's log\n")
        finally:
            del self._pending[key]
            pending.done.set()
        return pending.response

    async def _produce(self, open_metrics: bool, compress: bool) -> HttpResponse:
        started = time.perf_counter()
        writer = _Writer(open_metrics, compress)
        for metric in self.registry.collect():  # the proxy's own: small families
            writer.family(metric)
            await writer.maybe_yield()
        with _collector_paused() as paused:
            for source in list(self.sources):
                for piece in source():
                    if isinstance(piece, str):
                        writer.lines(piece)
                    elif isinstance(piece, YoungCollection):
                        if paused:
                            gc.collect(0)
                    elif piece is not None:
                        writer.family(piece)
                    await writer.maybe_yield()
            await writer.next_slice()
        # The young collection the pause held back (what the walk and the relay made
        # meanwhile, and what pushes just before left young) in a slice of its own,
        # not on top of the walk's last one, nor unaccounted at the next allocation.
        if gc.isenabled():
            gc.collect(0)
        body = await writer.finish()
        self.seconds.set(time.perf_counter() - started)
        self.loop_seconds.set(writer.longest)
        self.loop_cpu_seconds.set(writer.longest_cpu)
        self.bytes.set(sum(len(p) for p in body))
        self.scrapes.inc()
        ctype = openmetrics.CONTENT_TYPE_LATEST if open_metrics else CONTENT_TYPE_LATEST
        extra = [("content-encoding", "gzip")] if compress else []
        return HttpResponse(200, b"", ctype, extra, parts=body)


@contextlib.contextmanager
def _collector_paused() -> Iterator[bool]:
    """No automatic cyclic garbage collection while the sources are walked.

    A source groups its series by family in containers that hold a reference to each
    (250,000 at 250,000 series), and every collection of the young generations that
    finds such a container young walks all of its references, a cache miss each:
    about 20 ms per container on this machine, twice per scrape, every connection
    waiting. The containers are gone when the walk ends; what the relay allocates meanwhile is
    collected as usual right after (the allocation count keeps growing while paused,
    so the first allocation after it starts the collection that was due). Yields
    whether it paused the collector.
    """
    if not gc.isenabled():  # someone else's choice: leave it
        yield False
        return
    gc.disable()
    try:
        yield True
    finally:
        gc.enable()


class _Writer:
    """Renders pieces into a list of byte strings, compressing as it goes.

    Compression is part of the slices: rendered text is deflated on the loop each time
    ``ZIP_BYTES`` of it wait, between pieces (or first thing in the next slice when
    the last one's budget ran out), so it counts against the slices' budget and the
    rest as the rendering does; the last text and the end of the gzip stream each get
    a slice of their own.
    """

    def __init__(self, open_metrics: bool, compress: bool) -> None:
        self.open_metrics = open_metrics
        self._render: Callable[[_One], bytes] = (
            openmetrics.generate_latest if open_metrics else generate_latest)
        self._zip = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31) if compress else None
        self._text: list[bytes] = []  # rendered, not yet compressed
        self._text_bytes = 0
        self.parts: list[bytes] = []
        self.slice_start = time.perf_counter()
        self.slice_cpu = time.thread_time()
        self.longest = 0.0
        self.longest_cpu = 0.0

    def _add(self, data: bytes, end: bool = False) -> None:
        if self.open_metrics and not end and data.endswith(_EOF):
            data = data[: -len(_EOF)]
        if self._zip is None:
            self.parts.append(data)
            return
        self._text.append(data)
        self._text_bytes += len(data)

    def _deflate(self) -> None:
        assert self._zip is not None
        data = self._zip.compress(b"".join(self._text))
        self._text, self._text_bytes = [], 0
        if data:
            self.parts.append(data)

    def family(self, metric: Metric) -> None:
        self._add(self._render(_One(metric)))

    def lines(self, text: str) -> None:
        self._add(text.encode())

    async def maybe_yield(self) -> None:
        """After a piece: the loop's turn once the slice's budget is spent, else the
        text waiting deflated once there is ``ZIP_BYTES`` of it."""
        if time.perf_counter() - self.slice_start >= SLICE_SECONDS:
            await self.next_slice()
        else:
            self._deflate_if_due()

    async def next_slice(self) -> None:
        """Let the loop run, then start a slice: with the text waiting to be deflated."""
        self._end_slice()
        await trio.sleep(REST_SECONDS)
        self._start_slice()
        self._deflate_if_due()

    def _deflate_if_due(self) -> None:
        if self._zip is not None and self._text_bytes >= ZIP_BYTES:
            self._deflate()

    def _start_slice(self) -> None:
        self.slice_start = time.perf_counter()
        self.slice_cpu = time.thread_time()

    def _end_slice(self) -> None:
        self.longest = max(self.longest, time.perf_counter() - self.slice_start)
        self.longest_cpu = max(self.longest_cpu, time.thread_time() - self.slice_cpu)

    async def finish(self) -> list[bytes]:
        if self.open_metrics:
            self._add(_EOF, end=True)
        if self._zip is not None:
            await self.next_slice()
            self._deflate()
            await self.next_slice()
            self.parts.append(self._zip.flush())
        self._end_slice()
        return self.parts
