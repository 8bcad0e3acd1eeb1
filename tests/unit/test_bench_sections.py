"""The bench report's paired sections render when no repetition gave a ratio.

A smoke run's workloads are tiny and the kernel counts CPU in 10 ms ticks, so a
baseline's CPU can read zero in every round; the report must show "-" for that ratio,
not fail (it once did, in `make test` on a busy machine).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

import connection_cost_row
import p99_pair_row
import relay_ab
import small_request_ab
import throughput_pair_row
from bench_stats import median_range

PROOF = {"baseline_commit": "d1cc828" + "0" * 33, "current_commit": "abc1234",
         "current_import": "here", "base_import": "there"}


def test_median_range() -> None:
    assert median_range([]) == "-"
    assert median_range([1.0, 3.0, 2.0]) == "2.00 (1.00-3.00)"
    assert median_range([0.5], 1) == "0.5 (0.5-0.5)"


def test_relay_ab_with_a_baseline_cpu_of_zero() -> None:
    one = {"produce_mb_s": 100.0, "cpu_s_per_gb": 0.5, "consume_mb_s": 90.0,
           "metadata_p99_ms": 0.4}
    lines = relay_ab.section({**PROOF, "current": [one], "base": [{**one, "cpu_s_per_gb": 0.0}]})
    row = next(line for line in lines if line.startswith("| proxy CPU s per GB"))
    assert row.endswith("| - | - |")
    assert any(line.startswith("| produce 1 KB (MB/s) | 100.00 | 100.00 | 1.00 (1.00-1.00)")
               for line in lines)


def test_small_requests_with_a_baseline_cpu_of_zero() -> None:
    one = {"produce_cpu_ms": 0.1, "produce_p99_ms": 0.5, "metadata_cpu_ms": 0.1,
           "metadata_p99_ms": 0.4}
    lines = small_request_ab.section({**PROOF, "seconds": 5.0, "current": [one],
                                      "base": [{**one, "produce_cpu_ms": 0.0}]})
    row = next(line for line in lines if line.startswith("| single-message produce"))
    assert "| - |" in row


def test_connection_cost_with_haproxy_cpu_of_zero() -> None:
    ms = {"median": 0.5, "p90": 0.6, "p99": 0.7, "count": 20}
    lines = connection_cost_row.section({
        "reps": 1, "connections": 20,
        "ms": {name: ms for name in connection_cost_row.PATHS},
        "cpu_ms": {"kproxy": [0.5], "haproxy (tcp)": [0.0]}})
    assert any(line.startswith("| kproxy | 0.500 |") for line in lines)
    assert not any("per repetition: median" in line for line in lines)


def test_p99_pair_section_gives_each_workload_its_per_round_differences() -> None:
    def side(p99: float) -> dict[str, float]:
        return {"p50_ms": 0.2, "p99_ms": p99}

    data = {"seconds": 5.0, "rate": 1000, "rounds": [
        {"produce_latency": {"kproxy": side(0.5 + d), "haproxy (tcp)": side(0.5)},
         "metadata_latency": {"kproxy": side(0.3 + d), "haproxy (tcp)": side(0.3)}}
        for d in (0.0, 0.1, 0.2)]}
    lines = p99_pair_row.section(data)
    rows = [ln for ln in lines if ln.startswith("| small produce") or ln.startswith("| Metadata")]
    assert rows == [
        "| small produce at 1,000/s | 0.20 / 0.60 | 0.20 / 0.50 "
        "| +0.10 (quartiles +0.05 to +0.15; +0.00 to +0.20) |",
        "| Metadata at 1,000/s | 0.20 / 0.40 | 0.20 / 0.30 "
        "| +0.10 (quartiles +0.05 to +0.15; +0.00 to +0.20) |"]
    assert p99_pair_row.section({"error": "haproxy is not installed"})[-2] == (
        "- not measured: haproxy is not installed")


def test_throughput_pair_section_gives_each_workload_and_relay_its_ratio_and_cpu() -> None:
    def relays(kproxy: float, floor: float) -> dict[str, dict[str, float]]:
        # kproxy whose clients collect no metrics: 2% faster than kproxy in every round.
        # The brokers' CPU: measured behind kproxy and haproxy, not in the others' runs
        # (as in a run saved before the column).
        return {"kproxy": {"mb_s": kproxy, "cpu_s": 0.07, "broker_cpu_s": 0.16},
                p99_pair_row.UNSUBSCRIBED: {"mb_s": kproxy * 1.02, "cpu_s": 0.07},
                "haproxy (tcp)": {"mb_s": 100.0, "cpu_s": 0.05, "broker_cpu_s": 0.14},
                # haproxy splicing: always 1% behind haproxy copying.
                p99_pair_row.HAPROXY_SPLICE: {"mb_s": 99.0, "cpu_s": 0.03,
                                              "broker_cpu_s": 0.15},
                p99_pair_row.FLOOR: {"mb_s": floor, "cpu_s": 0.0}}

    given = ((97.0, 99.0), (99.0, 101.0), (98.0, 100.0), (96.0, 98.0), (100.0, 102.0))
    data = {"counts": {"produce_1k": 250_000, "produce_100b": 1_000_000, "consume": 250_000},
            "rounds": [{kind: relays(k, f) for kind in throughput_pair_row.WORKLOADS}
                       for k, f in given]}
    rows = [ln for ln in throughput_pair_row.section(data) if ln.startswith("| ")][1:]
    # CPU per GB: 0.07 s over 256 MB (1 KB workloads) or 100 MB (100 B).
    expected = []
    for label, gb in (("produce 1 KB", 0.256), ("produce 100 B", 0.1), ("consume 1 KB", 0.256)):
        expected += [
            f"| {label} | kproxy | 98.0 | 0.98 (quartiles 0.97 to 0.99; 0.96 to 1.00) "
            f"| {0.07 / gb:.2f} | {0.16 / gb:.2f} |",
            f"| {label} | kproxy, no metrics subscribed | 100.0 | 1.00 (quartiles 0.99 to "
            f"1.01; 0.98 to 1.02) | {0.07 / gb:.2f} | - |",
            f"| {label} | haproxy (tcp) | 100.0 | 1 | {0.05 / gb:.2f} | {0.14 / gb:.2f} |",
            f"| {label} | haproxy (tcp, splice) | 99.0 | 0.99 (quartiles 0.99 to 0.99; 0.99 "
            f"to 0.99) | {0.03 / gb:.2f} | {0.15 / gb:.2f} |",
            f"| {label} | floor relay (trio, splice) | 100.0 | 1.00 (quartiles 0.99 to 1.01; "
            "0.98 to 1.02) | 0.00 | - |"]
    assert rows == expected
    text = "".join(throughput_pair_row.section(data))
    assert "250,000 messages of 1 KB and 1,000,000 of 100 B" in text
    # What the default subscription costs its clients: kproxy over kproxy unsubscribed.
    assert ("per round: produce 1 KB 0.98 (quartiles 0.98 to 0.98; 0.98 to 0.98); "
            "produce 100 B 0.98") in text
    assert throughput_pair_row.section({"error": "haproxy is not installed"})[-2] == (
        "- not measured: haproxy is not installed")


def test_throughput_pair_section_takes_an_empty_consumers_cpu_off_consume() -> None:
    """A consumer of an empty topic in each round: its CPU per relay, consume's CPU per
    GB less it, kproxy over haproxy per round; and what a wake-up costs the machine."""
    def relays(kind: str, kproxy_cpu: float) -> dict[str, dict[str, float]]:
        return {"kproxy": {"mb_s": 100.0 if kind != throughput_pair_row.EMPTY else 0.0,
                           "cpu_s": kproxy_cpu},
                "haproxy (tcp)": {"mb_s": 100.0 if kind != throughput_pair_row.EMPTY
                                  else 0.0,
                                  "cpu_s": 0.002 if kind == throughput_pair_row.EMPTY
                                  else 0.082}}

    cpu = {"produce_1k": 0.1, "produce_100b": 0.1, "consume": 0.12,
           throughput_pair_row.EMPTY: 0.04}
    data = {"counts": {"produce_1k": 250_000, "produce_100b": 1_000_000, "consume": 250_000},
            "rounds": [{kind: relays(kind, c) for kind, c in cpu.items()}] * 3,
            "wakes": {"python": {"0.01": 310.0, "1.0": 2900.0},
                      "trio": {"0.01": 3180.0, "1.0": 14800.0}},
            "pages": {"0.0": 37.0, "1.0": 8917.0}}
    text = "\n".join(throughput_pair_row.section(data))
    # 0.08 s and 0.08 s over 256,000,000 bytes: 0.31 s per GB each, a ratio of 1.00.
    assert ("A consumer of an empty topic, the relay's CPU over it, median: kproxy 40 ms, "
            "haproxy (tcp) 2 ms. Consume 1 KB's CPU per GB with that taken off, median: "
            "kproxy 0.31, haproxy (tcp) 0.31. kproxy / haproxy so, per round: 1.00 "
            "(quartiles 1.00 to 1.00; 1.00 to 1.00).") in text
    assert ("its CPU per wake-up; `tests/bench/host_wakes.py`): python 310 us at 10 ms, "
            "2,900 us at 1 s; trio 3,180 us at 10 ms, 14,800 us at 1 s.") in text
    assert ("What reading a page costs again (one byte of each of 4,096 pages touched "
            "just before; CPU per page): 37 ns at once, 8,917 ns after 1 s.") in text
    # The table keeps one row per workload it always had: none for the empty consumer.
    assert not [ln for ln in throughput_pair_row.section(data) if "empty" in ln
                and ln.startswith("| ")]
