"""The churn benchmark's throughput over a window: edges interpolated between commits, not rounded to iterations."""

import pytest

from benchmarks.throughput_window import committed_tokens, whole_iterations_rate, window_rate


def commits(*times: float, tokens: float = 100.0) -> list[dict]:
    """Commit records (`iteration_metrics`' fields) at wall `times`, each of `tokens` tokens over 2 s."""
    return [{"time": t, "tokens_per_s": tokens / 2.0, "iteration_seconds": 2.0} for t in times]


def test_tokens_accrue_evenly_between_commits():
    records = commits(10.0, 20.0, 30.0)
    assert committed_tokens(records, 5.0) == 0.0  # before the first commit: its period's start is unknown
    assert committed_tokens(records, 10.0) == 100.0
    assert committed_tokens(records, 12.5) == pytest.approx(125.0)
    assert committed_tokens(records, 29.0) == pytest.approx(290.0)
    assert committed_tokens(records, 99.0) == 300.0  # past the last commit: nothing more


def test_a_steady_run_measures_its_rate_wherever_the_window_falls():
    records = commits(*[10.0 * k for k in range(1, 31)])  # 100 tokens every 10 s: 10 tokens/s
    for start in (15.0, 19.9, 20.0, 23.3):
        assert window_rate(records, start, start + 45.0) == pytest.approx(10.0)
        # by whole iterations the same run measures 8.9 or 11.1 tokens/s, by where the edges fall
    assert {round(whole_iterations_rate(records, s, s + 45.0), 1) for s in (15.0, 20.0)} == {8.9, 11.1}


def test_a_stall_at_the_end_counts_against_the_run():
    """The commit that ends a stall spreads its tokens over the whole stall: the window gets only its share."""
    records = commits(10.0, 20.0, 30.0, 70.0)  # the last iteration took 40 s
    assert window_rate(records, 10.0, 40.0) == pytest.approx((200.0 + 25.0) / 30.0)
    assert window_rate(records, 10.0, 40.0) < window_rate(records, 10.0, 30.0)


def test_a_run_stopped_at_the_window_end_counts_its_whole_iterations():
    records = commits(10.0, 20.0, 30.0)
    assert window_rate(records, 10.0, 35.0) == whole_iterations_rate(records, 10.0, 35.0) == pytest.approx(8.0)


def test_a_window_must_have_a_length():
    with pytest.raises(ValueError):
        window_rate(commits(10.0), 5.0, 5.0)
