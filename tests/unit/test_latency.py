"""Outcome latency counts: fixed buckets, Prometheus' cumulative form, quantile estimates."""

from __future__ import annotations

import random

import pytest

from truba.latency import BOUNDS, BUCKETS, LatencyCounts


def test_each_latency_falls_in_the_bucket_of_the_first_bound_at_or_above_it() -> None:
    counts = LatencyCounts()
    for seconds in (0.0, 0.005, 0.0051, 0.9, 1.0, 3600.0, 3600.1, 1e9):
        counts.observe(seconds)
    assert counts.counts[0] == 2  # 0 and exactly 5 ms: le="0.005"
    assert counts.counts[1] == 1  # 5.1 ms
    assert counts.counts[BOUNDS.index(1.0)] == 2  # 0.9 s and 1 s
    assert counts.counts[BOUNDS.index(3600.0)] == 1
    assert counts.counts[-1] == 2  # above an hour
    assert counts.count == 8 and counts.sum == pytest.approx(0.0101 + 1.9 + 7200.1 + 1e9)


def test_the_buckets_go_from_5_ms_to_an_hour() -> None:
    assert BOUNDS[0] == 0.005 and BOUNDS[-1] == 3600.0 and list(BOUNDS) == sorted(set(BOUNDS))
    assert BUCKETS == len(BOUNDS) + 1


def test_cumulative_buckets_are_prometheus_le_buckets_ending_with_inf() -> None:
    counts = LatencyCounts()
    for seconds in (0.001, 0.2, 0.2, 5000.0):
        counts.observe(seconds)
    buckets = counts.cumulative()
    assert buckets[0] == ("0.005", 1)
    assert dict(buckets)["0.25"] == 3 and dict(buckets)["3600.0"] == 3
    assert buckets[-1] == ("+Inf", 4) and len(buckets) == BUCKETS
    assert [n for _, n in buckets] == sorted(n for _, n in buckets)


def test_quantiles_are_estimated_within_their_bucket_like_histogram_quantile() -> None:
    counts = LatencyCounts()
    assert counts.quantile(0.5) is None
    for _ in range(100):
        counts.observe(0.3)  # all in (0.25, 0.5]
    assert counts.quantile(0.5) == pytest.approx(0.375)  # halfway through the bucket
    assert counts.quantile(0.99) == pytest.approx(0.25 + 0.25 * 0.99)
    counts.observe(10_000.0)
    assert counts.quantile(1.0) == BOUNDS[-1]  # above the last bound: the last bound
    with pytest.raises(ValueError, match="q: must be 0..1"):
        counts.quantile(1.5)


def test_the_estimate_of_a_spread_is_within_its_bucket() -> None:
    rng = random.Random(7)
    samples = sorted(rng.lognormvariate(-3, 1.5) for _ in range(10_000))
    counts = LatencyCounts()
    for seconds in samples:
        counts.observe(seconds)
    for q in (0.5, 0.9, 0.99):
        true = samples[int(q * len(samples))]
        estimate = counts.quantile(q)
        assert estimate is not None
        upper = next(b for b in BOUNDS if b >= true)
        lower = max([0.0, *(b for b in BOUNDS if b < true)])
        assert lower <= estimate <= upper, (q, true, estimate)


def test_counts_add_and_a_later_state_less_an_earlier_is_what_came_between() -> None:
    earlier = LatencyCounts()
    earlier.observe(0.02)
    later = earlier.copy()
    later.observe(2.0)
    later.observe(2.0)
    between = later - earlier
    assert between.count == 2 and between.sum == pytest.approx(4.0) and between.quantile(0.5) is not None
    assert earlier + between == later
    assert earlier.count == 1  # copies: the earlier state is untouched
    with pytest.raises(ValueError, match="buckets expected"):
        LatencyCounts([1, 2, 3])
