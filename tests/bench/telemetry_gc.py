"""What client telemetry series held cost the cyclic garbage collector, memory and ingest.

A full collection walks every tracked object with the event loop held, so what the
series store keeps per series must not be tracked. The store is filled through its
public ingest path (librdkafka-like pushes, ``series`` per instance), labelled by one
scrape, then measured: full ``gc.collect()`` time, tracked objects, bytes per series
(tracemalloc) and the cost of an ingest and of a repeat landed from its values alone.

    .venv/bin/python -m tests.bench.telemetry_gc [instances] [series per instance]
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
import tracemalloc
import uuid

from opentelemetry.proto.metrics.v1 import metrics_pb2

from kproxy.codecs.otlp.model import decode_metrics_data
from kproxy.metrics.proxy_metrics import ProxyMetrics
from kproxy.policies.telemetry.store import MetricsStore
from kproxy.telemetry.exposition import ClientMetricsCollector
from kproxy.telemetry.service import TelemetryService
from tests.otlp_samples import as_temporality, kv, librdkafka_like_payload, number_values
from tests.support import make_config


def labels(iid: uuid.UUID) -> dict[str, str]:
    return {"client_instance_id": str(iid), "client_id": f"client-{iid.int}",
            "client_software_name": "librdkafka", "client_software_version": "2.16.1"}


def fill(instances: int, per_instance: int) -> tuple[TelemetryService, ClientMetricsCollector]:
    """A service whose store holds ``instances * per_instance`` series, each labelled."""
    cfg = make_config("127.0.0.1:1", telemetry_max_series=instances * per_instance,
                      telemetry_max_series_bytes=2**40)
    metrics = ProxyMetrics()
    service = TelemetryService(cfg.telemetry, metrics)
    resources = decode_metrics_data(librdkafka_like_payload(points=per_instance - 2))
    for i in range(instances):
        iid = uuid.UUID(int=i + 1)
        service.store.ingest(iid, labels(iid), resources, False)
    collector = next(s for s in metrics.piece_sources if isinstance(s, ClientMetricsCollector))
    for _ in collector():  # one scrape: every series gets its label text
        pass
    return service, collector


def full_gc_ms(rounds: int = 9) -> float:
    """The median CPU time of a full collection (CPU: other processes on a busy
    machine do not count)."""
    times = []
    for _ in range(rounds):
        start = time.process_time()
        gc.collect()
        times.append((time.process_time() - start) * 1000)
    return statistics.median(times)


def number_push(nodes: int) -> bytes:
    """A sum and a gauge with node.id points: what the repeat fast path lands."""
    md = metrics_pb2.MetricsData()
    sm = md.resource_metrics.add().scope_metrics.add()
    s = sm.metrics.add(name="requests")
    s.sum.aggregation_temporality = as_temporality(2)
    s.sum.is_monotonic = True
    g = sm.metrics.add(name="latency")
    for node in range(nodes):
        s.sum.data_points.add(as_int=node, attributes=[kv("node.id", node)])
        g.gauge.data_points.add(as_double=1.5 * node, attributes=[kv("node.id", node)])
    return md.SerializeToString()


def ingest_costs(repeats: int = 2000) -> dict[str, float]:
    """CPU microseconds per push: a new instance's 250-series push, the same push again
    (series updated), and a small repeat landed from its values alone."""
    resources = decode_metrics_data(librdkafka_like_payload(points=248))
    store = MetricsStore(max_series=10**7, max_series_bytes=10**12)
    ids = [uuid.UUID(int=i + 1) for i in range(repeats // 10)]
    start = time.process_time()
    for iid in ids:
        store.ingest(iid, labels(iid), resources, False)
    new = (time.process_time() - start) / len(ids)
    start = time.process_time()
    for iid in ids:
        store.ingest(iid, labels(iid), resources, True)
    again = (time.process_time() - start) / len(ids)
    small = decode_metrics_data(number_push(8))
    values = number_values(small)
    out = {"ingest_new_250_us": new * 1e6, "ingest_again_250_us": again * 1e6}
    for delta in (False, True):
        _, landing = store.ingest_noting(ids[0], labels(ids[0]), small, delta)
        assert landing is not None
        start = time.process_time()
        for _ in range(repeats * 10):
            store.land(ids[0], landing, values, delta)
        land = (time.process_time() - start) / (repeats * 10)
        out[f"land_16_points_{'delta' if delta else 'cumulative'}_us"] = land * 1e6
    return out


def main(instances: int = 1000, per_instance: int = 250) -> None:
    gc.collect()
    base_ms, base_tracked = full_gc_ms(), len(gc.get_objects())
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    service = fill(instances, per_instance)[0]
    for _ in range(3):  # nested tuples are untracked a level a pass
        gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    total = service.store.total
    tracked = len(gc.get_objects()) - base_tracked
    print(f"series held: {total:,} ({instances:,} instances x {per_instance})")
    print(f"bytes per series (tracemalloc, label text included): {held / total:,.0f}")
    print(f"tracked objects added: {tracked:,} ({tracked / total:.3f} per series)")
    held_ms = full_gc_ms()
    del service
    gc.collect()
    dropped_ms = full_gc_ms()
    print(f"full gc.collect() CPU: {held_ms:.1f} ms median with the series held; "
          f"{dropped_ms:.1f} ms once dropped ({base_ms:.1f} ms before filling)")
    for name, us in ingest_costs().items():
        print(f"{name}: {us:,.1f} us")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
