"""The verdicts of `make bench`'s targets (issues 19 and 30, 14 and 22), on made-up runs.

A real run takes minutes and a smoke run's figures decide nothing, so the rules that
turn a run's figures into "met" or "how far off" are checked here on runs whose
answers are known.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_measure import Path_
from bench_targets import ALONGSIDE, NOT_JUDGED, ratio_table, targets, verdict
from hostile_push_row import HOSTILE, QUIET
from telemetry_p99_row import DEFAULT, FAST

N1K = 250_000
SMALL_MET = {"current": [{"produce_cpu_ms": 0.15, "metadata_cpu_ms": 0.16},
                         {"produce_cpu_ms": 0.16, "metadata_cpu_ms": 0.17}]}
SMALL_OFF = {"current": [{"produce_cpu_ms": 0.30, "metadata_cpu_ms": 0.40}]}
BASELINE = {"baseline_commit": "d1cc828e42f23b793e9e32bbf797f2c5a0222465",
            "current": [{"pushes_per_cpu_s": 9000.0}, {"pushes_per_cpu_s": 8000.0}],
            "base": [{"pushes_per_cpu_s": 4000.0}, {"pushes_per_cpu_s": 4200.0}]}


def paths(kp_over_hp: list[float], p99_extra_ms: list[float], cpu_factor: float,
          idle_mb_per_1000: float) -> list[Path_]:
    """direct, kproxy and haproxy: kproxy's throughput and p99 relative to haproxy's
    in each repetition as given, its CPU ``cpu_factor`` times haproxy's."""
    reps = len(kp_over_hp)

    def results(mb: list[float], p99: list[float], cpu: float) -> dict[str, list[dict[str, float]]]:
        out: dict[str, list[dict[str, float]]] = {
            key: [{"mb_s": m, "proxy_cpu_s": cpu} for m in mb]
            for key in ("produce_1k", "produce_100b", "consume")}
        for key in ("produce_latency", "metadata_latency"):
            out[key] = [{"p99_ms": v} for v in p99]
        return out

    hp = results([100.0] * reps, [0.4] * reps, 0.1)
    kp = results([100.0 * r for r in kp_over_hp], [0.4 + d for d in p99_extra_ms],
                 0.1 * cpu_factor)
    hp["idle"] = [{"1000": 5.0}]
    kp["idle"] = [{"1000": idle_mb_per_1000}]
    return [Path_("direct", "", None, results([120.0] * reps, [0.3] * reps, 0.0)),
            Path_("kproxy", "", None, kp), Path_("haproxy (tcp)", "", None, hp)]


def scrape_rows(slices_ms: list[float], ratio_apart: float) -> list[dict[str, float]]:
    """The scrape section's sizes: the largest one's p99 ratio is the judged one."""
    return [{"series": 10_000 * (i + 1), "longest_slice_cpu_ms": ms, "ratio": 3.0,
             "ratio_apart": ratio_apart + i, "ratio_apart_min": 1.0, "ratio_apart_max": 4.0}
            for i, ms in enumerate(slices_ms)][::-1]


def hostile(ratios: list[float], failed: int = 0) -> dict[str, object]:
    """The hostile-push section's rounds: p99 with the pusher ``ratio`` times without."""
    return {"rounds": [{QUIET: {"p99_ms": 0.4, "failed": 0},
                        HOSTILE: {"p99_ms": 0.4 * r, "failed": failed if i == 0 else 0}}
                       for i, r in enumerate(ratios)]}


def verdicts(lines: list[str]) -> list[str]:
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| target")]
    return [row.rstrip(" |").rsplit(" | ", 1)[1] for row in rows]


def test_every_target_met() -> None:
    run = paths([1.02, 0.99, 1.01], [0.10, 0.12, 0.20], 1.4, 3.5)
    assert verdicts(targets(run, [1000], N1K, BASELINE, SMALL_MET, scrape_rows([0.6, 2.32], 0.9),
                            {"series": {"1": 250_000, "2": 250_000}, "ratios": [1.2, 1.5, 1.6]},
                            hostile_push=hostile([1.5, 2.0, 1.2]))
                    ) == ["met"] * 5 + [NOT_JUDGED] + ["met"] * 10


def test_how_far_off_each_target_is() -> None:
    run = paths([0.80, 0.85, 0.90], [0.40, 0.45, 0.50], 2.5, 10.0)
    assert verdicts(targets(run, [1000], N1K, {**BASELINE, "current": [
        {"pushes_per_cpu_s": 6000.0}, {"pushes_per_cpu_s": 6300.0}]}, SMALL_OFF,
        scrape_rows([3.0], 2.5), {"series": {"1": 9, "2": 9}, "ratios": [1.7, 1.9]},
        hostile_push=hostile([3.0, 2.5, 4.0])
    )) == [
        "**not met**: 0.15 short"] * 3 + ["**not met**: 0.30 ms over"] * 2 + [NOT_JUDGED] + [
        "**not met**: 1.00 over"] * 2 + ["**not met**: 6.24 KB over", "**not met**: 0.50 short",
        "**not met**: 0.13 ms over", "**not met**: 0.23 ms over", "**not met**: 0.68 ms over",
        "**not met**: 0.50 over", "**not met**: 1.00 over", "**not met**: 0.30 over"]


def test_throughput_below_haproxy_but_within_the_spread() -> None:
    run = paths([0.90, 0.97, 0.98, 1.01, 1.06], [0.0] * 5, 1.0, 1.0)
    assert verdicts(targets(run, [1000], N1K, BASELINE))[:3] == ["met within the spread"] * 3


def test_what_was_not_measured_has_no_verdict() -> None:
    run = paths([1.0], [0.0], 1.0, 1.0)
    without_haproxy = run[:2]
    found = verdicts(targets(without_haproxy, [1000], N1K, {"error": "shallow clone"}))
    # Memory is kproxy's own figure; small requests and scrapes were not measured.
    assert found == ["-"] * 5 + [NOT_JUDGED] + ["-"] * 2 + ["met"] + ["-"] * 7


def test_a_failed_delivery_beside_hostile_pushes_misses_the_target_whatever_the_p99() -> None:
    lines = targets(paths([1.0], [0.0], 1.0, 1.0), [1000], N1K, BASELINE,
                    hostile_push=hostile([1.2, 1.4, 1.3], failed=2))
    row = next(ln for ln in lines if ln.startswith("| producer p99 beside"))
    assert row.split(" | ")[1] == ("1.30 (quartiles 1.25 to 1.35; 1.20 to 1.40); "
                                   "2 failed deliveries")
    assert verdicts([row]) == ["**not met**: 2 failed deliveries"]


def test_the_scrape_p99_is_judged_at_the_largest_size_with_the_proxy_on_its_own_core() -> None:
    lines = targets(paths([1.0], [0.0], 1.0, 1.0), [1000], N1K, BASELINE,
                    scrape=scrape_rows([0.5, 0.6, 0.7], 0.8))
    row = next(ln for ln in lines if ln.startswith("| producer p99 during"))
    assert row.split(" | ")[0] == ("| producer p99 during back-to-back /metrics scrapes of "
                                   "30,000 client series / without, the proxy on a core of "
                                   "its own")
    assert row.split(" | ")[1] == "2.80 (1.00-4.00; cores shared: 3.00)"
    assert verdicts([row]) == ["**not met**: 0.80 over"]


def test_what_fast_telemetry_pushes_add_is_shown_beside_the_p99_target() -> None:
    """The latency paths run kproxy's default telemetry settings; the telemetry-p99
    section's rounds (pushes every 100 ms against the default) give the row under them."""
    rounds = [{"direct": {"p99_ms": 0.3}, FAST: {"p99_ms": 0.3 + fast},
               DEFAULT: {"p99_ms": 0.3 + default}}
              for fast, default in ((0.50, 0.10), (0.30, 0.20), (0.90, 0.10))]
    lines = targets(paths([1.0], [0.0], 1.0, 1.0), [1000], N1K, BASELINE,
                    telemetry_p99={"rounds": rounds})
    row = next(ln for ln in lines if "by pushes every 100 ms" in ln)
    assert row.split(" | ")[1] == "+0.40 (+0.10 to +0.80)"
    assert row.endswith(f"| {NOT_JUDGED} |")


def test_ratio_table_has_a_row_per_figure() -> None:
    workers = {"clients": 4, "workers": [1, 2], "results": {
        "1": {"produce_1k": [{"mb_s": 100.0}], "consume": [{"mb_s": 80.0}]},
        "2": {"produce_1k": [{"mb_s": 150.0}], "consume": [{"mb_s": 80.0}]}}}
    lines = ratio_table(paths([0.9, 1.1], [0.1, 0.1], 2.0, 10.0), [1000], BASELINE, workers)
    rows = {ln.split(" | ")[0][2:]: ln.split(" | ")[1] for ln in lines
            if ln.startswith("| ") and not ln.startswith("| figure")}
    assert rows["produce 1 KB, MB/s: kproxy / haproxy"] == "1.00"
    assert rows["CPU s per GB relayed, produce 1 KB: kproxy / haproxy"] == "2.00"
    assert rows["memory per idle connection pair: kproxy / haproxy"] == "2.00"
    assert rows["produce 1 KB, MB/s, 4 clients: --workers 2 / --workers 1"] == "1.50"
    assert rows["telemetry pushes per CPU-second: this tree / d1cc828"] == "2.08"


def test_a_miss_smaller_than_the_rounding_still_says_by_how_much() -> None:
    run = paths([1.0, 1.0, 1.0], [0.1502, 0.1502, 0.1502], 1.0, 1.0)
    assert verdicts(targets(run, [1000], N1K, BASELINE))[3:5] == [
        "**not met**: 0.0002 ms over"] * 2


def test_a_p99_row_shows_how_far_the_repetitions_spread() -> None:
    """One repetition's p99 moves a lot on a shared machine: the row gives the
    quartiles of the per-repetition differences beside the median it judges."""
    run = paths([1.0] * 5, [-0.10, 0.05, 0.10, 0.20, 0.60], 1.0, 1.0)
    row = next(ln for ln in targets(run, [1000], N1K, BASELINE)
               if ln.startswith("| p99 added at 1,000/s, Metadata"))
    measured, verdict = row.split(" | ")[1], row.rstrip(" |").rsplit(" | ", 1)[1]
    assert measured == ("+0.10 (quartiles +0.05 to +0.20; over direct: kproxy +0.20, "
                        "haproxy +0.10)")
    assert verdict == "met"  # the median decides, not a quartile


def test_the_pair_rounds_are_shown_under_each_judged_p99_row_unjudged() -> None:
    """The two-proxies-alone section answers the same question with more rounds; its
    figure sits under the judged row and never decides the verdict."""
    run = paths([1.0] * 3, [0.30, 0.30, 0.30], 1.0, 1.0)

    def pair_round(kproxy_ms: float) -> dict[str, dict[str, float]]:
        return {"kproxy": {"p50_ms": 0.2, "p99_ms": kproxy_ms},
                "haproxy (tcp)": {"p50_ms": 0.1, "p99_ms": 0.3}}

    pair = {"rounds": [{"produce_latency": pair_round(0.3 + d),
                        "metadata_latency": pair_round(0.3 + d)}
                       for d in (0.02, 0.05, 0.08, 0.11, 0.40)]}
    lines = targets(run, [1000], N1K, BASELINE, p99_pair=pair)
    p99 = [ln for ln in lines if ln.startswith("| p99 added at 1,000/s")]
    assert [ln.split(" | ")[0] for ln in p99] == [
        "| p99 added at 1,000/s, small produce: kproxy - haproxy (ms)",
        "| p99 added at 1,000/s, small produce, the two proxies alone (5 rounds): "
        "kproxy - haproxy (ms)",
        "| p99 added at 1,000/s, Metadata: kproxy - haproxy (ms)",
        "| p99 added at 1,000/s, Metadata, the two proxies alone (5 rounds): "
        "kproxy - haproxy (ms)",
        "| p99 added at 1,000/s, small produce, by pushes every 100 ms instead of the "
        "default: kproxy - kproxy (ms)"]
    assert p99[1].split(" | ")[1] == "+0.08 (quartiles +0.05 to +0.11; +0.02 to +0.40)"
    assert verdicts(p99) == ["**not met**: 0.15 ms over", ALONGSIDE,
                             "**not met**: 0.15 ms over", ALONGSIDE, NOT_JUDGED]


def test_the_relays_alone_are_shown_under_each_judged_throughput_row_unjudged() -> None:
    """The throughput-pair section measures kproxy, kproxy whose clients collect no
    metrics, haproxy splicing and a floor relay against haproxy in more rounds, for each
    of the main section's throughput workloads; the four ratios sit under that
    workload's judged row, and the verdict stays the main section's."""
    run = paths([0.97, 0.98, 0.98], [0.0] * 3, 1.0, 1.0)

    def relays(kproxy: float, floor: float) -> dict[str, dict[str, float]]:
        return {"kproxy": {"mb_s": 100.0 * kproxy, "cpu_s": 0.1},
                "kproxy, no metrics subscribed": {"mb_s": 100.0 * (kproxy + 0.01),
                                                  "cpu_s": 0.1},
                "haproxy (tcp)": {"mb_s": 100.0, "cpu_s": 0.1},
                "haproxy (tcp, splice)": {"mb_s": 99.0, "cpu_s": 0.05},
                "floor relay (trio, splice)": {"mb_s": 100.0 * floor, "cpu_s": 0.1}}

    # produce 1 KB reads as given, produce 100 B 0.02 higher, consume 0.04 higher.
    given = ((0.96, 0.97), (0.98, 0.99), (1.00, 1.00), (1.01, 0.98), (0.99, 1.02))
    pair = {"rounds": [{kind: relays(k + step, f + step) for kind, step in
                        (("produce_1k", 0.0), ("produce_100b", 0.02), ("consume", 0.04))}
                       for k, f in given]}
    lines = targets(run, [1000], N1K, BASELINE, throughput_pair=pair)
    rows = [ln for ln in lines if ln.startswith("| throughput")]
    names = []
    for label in ("produce 1 KB", "produce 100 B", "consume 1 KB"):
        names += [f"| throughput, {label}: kproxy / haproxy",
                  f"| throughput, {label}, the relays alone (5 rounds): kproxy / haproxy",
                  f"| throughput, {label}, the relays alone (5 rounds): "
                  "kproxy, no metrics subscribed / haproxy",
                  f"| throughput, {label}, the relays alone (5 rounds): "
                  "haproxy (tcp, splice) / haproxy",
                  f"| throughput, {label}, the relays alone (5 rounds): "
                  "floor relay (trio, splice) / haproxy"]
    assert [ln.split(" | ")[0] for ln in rows] == names
    assert [rows[i].split(" | ")[1] for i in (1, 2, 3, 4, 6, 11)] == [
        "0.99 (quartiles 0.98 to 1.00; 0.96 to 1.01)",
        "1.00 (quartiles 0.99 to 1.01; 0.97 to 1.02)",
        "0.99 (quartiles 0.99 to 0.99; 0.99 to 0.99)",
        "0.99 (quartiles 0.98 to 1.00; 0.97 to 1.02)",
        "1.01 (quartiles 1.00 to 1.02; 0.98 to 1.03)",
        "1.03 (quartiles 1.02 to 1.04; 1.00 to 1.05)"]
    assert verdicts(rows) == ["**not met**: 0.02 short", *[ALONGSIDE] * 4] * 3
    # Without the section, the judged rows alone.
    assert len([ln for ln in targets(run, [1000], N1K, BASELINE)
                if ln.startswith("| throughput")]) == 3


def test_consume_cpu_less_an_empty_consumers_is_shown_under_the_judged_row() -> None:
    """Each round of the relays-alone section also runs a consumer of an empty topic;
    consume's CPU less that one's, kproxy over haproxy per round, sits under the judged
    consume CPU row, unjudged. Runs saved before it have no such row."""
    run = paths([0.97, 0.98, 0.98], [0.0] * 3, 1.0, 1.0)

    def round_(kproxy_consume: float) -> dict[str, dict[str, dict[str, float]]]:
        return {"consume": {"kproxy": {"mb_s": 100.0, "cpu_s": kproxy_consume},
                            "haproxy (tcp)": {"mb_s": 100.0, "cpu_s": 0.08}},
                "consume_empty": {"kproxy": {"mb_s": 0.0, "cpu_s": 0.03},
                                  "haproxy (tcp)": {"mb_s": 0.0, "cpu_s": 0.0}}}

    # (0.12 - 0.03) / 0.08, (0.11 - 0.03) / 0.08, (0.13 - 0.03) / 0.08
    pair = {"rounds": [round_(0.12), round_(0.11), round_(0.13)]}
    lines = targets(run, [1000], N1K, BASELINE, throughput_pair=pair)
    rows = [ln for ln in lines if ln.startswith("| CPU s per GB relayed (consume")]
    assert [ln.split(" | ")[0] for ln in rows] == [
        "| CPU s per GB relayed (consume 1 KB): kproxy / haproxy",
        "| CPU s per GB relayed (consume 1 KB), the relays alone (3 rounds), less what a "
        "consumer of an empty topic cost: kproxy / haproxy"]
    assert rows[1].split(" | ")[1] == "1.12 (quartiles 1.06 to 1.19; 1.00 to 1.25)"
    assert verdicts(rows[1:]) == [ALONGSIDE]
    old = {"rounds": [{k: v for k, v in round_(0.12).items() if k == "consume"}]}
    assert len([ln for ln in targets(run, [1000], N1K, BASELINE, throughput_pair=old)
                if ln.startswith("| CPU s per GB relayed (consume")]) == 1


def test_a_figure_past_its_limit_by_float_arithmetic_alone_meets_it() -> None:
    """12 ticks of CPU over 8, as /proc's differences give them: exactly 1.5."""
    assert verdict(0.120000000000001 / 0.08000000000000007, 1.5, True) == "met"
    assert verdict(1.5 - 1e-14, 1.5, False) == "met"
    assert verdict(1.501, 1.5, True) == "**not met**: 0.001 over"
    assert verdict(0.999, 1.0, False) == "**not met**: 0.001 short"
