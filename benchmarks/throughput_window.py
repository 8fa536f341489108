"""Tokens per second over a window of wall time, from a run's commit records, without rounding the window's edges
to whole iterations.

Counting the iterations committed within a window rounds its work to whole iterations: at 20 peers on 2 cores a
4-minute window holds 10-14 iterations of ~20 s, so where its end falls moves the figure by 7-10% (a churn run's
"kept" share by as much). Here the tokens committed by a time are interpolated between the commits either side of
it: an iteration's tokens accrue evenly from the commit before it to its own, so one that straddles an edge counts
for its share inside the window. A stall at the window's end still costs the run in full: the tokens of the commit
that ends it are spread over the whole stall, most of them past the end. Past the last commit nothing is known and
nothing more is counted, so a run stopped at the window's end is measured as by whole iterations.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


def iteration_tokens(record: dict) -> float:
    """The tokens one commit record (`iteration_metrics`) counted: its rate times the span it is a rate over."""
    return (record.get("tokens_per_s") or 0.0) * (record.get("iteration_seconds") or 0.0)


def committed_tokens(records: Sequence[dict], at: float) -> float:
    """Tokens committed by wall time `at` (`records` oldest first, each with its commit's wall `time`): those of
    every commit up to `at`, and of the next commit the share of its period, from the commit before it, that has
    passed. Before the first commit: 0 (its period's start is unknown); after the last: all of them."""
    times = [r["time"] for r in records]
    k = bisect_right(times, at)  # records[:k] were committed by `at`
    done = sum(iteration_tokens(r) for r in records[:k])
    if k == 0 or k == len(records):
        return done
    period = times[k] - times[k - 1]
    return done + (iteration_tokens(records[k]) * (at - times[k - 1]) / period if period > 0 else 0.0)


def window_rate(records: Sequence[dict], start: float, end: float) -> float:
    """Tokens per second committed between wall times `start` and `end` (`committed_tokens` at each edge)."""
    if not end > start:
        raise ValueError(f"a window must end after it starts: {start} .. {end}")
    return (committed_tokens(records, end) - committed_tokens(records, start)) / (end - start)


def whole_iterations_rate(records: Sequence[dict], start: float, end: float) -> float:
    """Tokens per second of the iterations committed within (start, end]: the edges rounded to whole iterations
    (this benchmark's figure before `window_rate`; kept to compare with earlier results)."""
    if not end > start:
        raise ValueError(f"a window must end after it starts: {start} .. {end}")
    return sum(iteration_tokens(r) for r in records if start < r["time"] <= end) / (end - start)
