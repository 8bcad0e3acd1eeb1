"""What group tracking adds per Fetch response: the high-watermark walk, measured beside
the walk the address rewriter does for Fetch v16+ without tracking. With tracking on,
a v16+ response without NodeEndpoints is walked once (the watermark walk replaces the
address walk); older versions relayed whole pay the watermark walk on top.

Run: .venv/bin/python tests/bench/group_tracking_cost.py (CPU only, no sockets).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable

from kproxy.codecs import api_keys
from kproxy.codecs.headers import ResponseHeader, write_response_header
from kproxy.codecs.interpreter import encode_into
from kproxy.codecs.primitives import Writer
from kproxy.codecs.registry import DECODED
from kproxy.policies.addressing import PortMap
from kproxy.policies.fetch_watermarks import fetch_watermarks
from kproxy.policies.rewrite import rewrite_response_frame


def frame(version: int, topics: int, partitions: int, record_bytes: int) -> bytes:
    spec = DECODED[api_keys.FETCH].response
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": f"t{t}", "topic_id": uuid.uuid4(), "partitions": [
            {"partition_index": p, "error_code": 0, "high_watermark": 10_000,
             "last_stable_offset": 10_000, "log_start_offset": 0,
             "aborted_transactions": None, "preferred_read_replica": -1,
             "records": b"\x01" * record_bytes} for p in range(partitions)]}
        for t in range(topics)]}
    w = Writer()
    write_response_header(w, ResponseHeader(1, {}), api_keys.FETCH, version)
    encode_into(spec, version, body, w)
    return w.getvalue()


def per_call(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    pm = PortMap("proxy", 30000, 30000, 0, 1023)
    shapes = [("1 topic x 2 partitions, 512 KiB records each", 1, 2, 512 * 1024),
              ("10 topics x 10 partitions, 1 KiB each", 10, 10, 1024),
              ("1 topic x 1 partition, empty (caught up)", 1, 1, 0)]
    for version in (12, 16):
        for name, topics, parts, size in shapes:
            f = memoryview(frame(version, topics, parts, size))
            walk = per_call(functools.partial(fetch_watermarks, version, f, []), 2000)
            line = f"Fetch v{version} {name} ({len(f)} bytes): watermark walk {walk:.1f} us"
            if version >= 16:
                addr = per_call(functools.partial(rewrite_response_frame, api_keys.FETCH,
                                                  version, f, pm), 2000)
                line += f"; address walk already done {addr:.1f} us"
            print(line)


if __name__ == "__main__":
    main()
