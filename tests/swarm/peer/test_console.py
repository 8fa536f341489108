"""A volunteer's console: one line per iteration, printed even when the logs go to a file."""

import io
import logging

from swarm.peer.console import IterationSummary, console_logger, install_console, iteration_line
from swarm.peer.timeline import Timeline


def test_the_line_says_stage_work_compute_share_and_throughput():
    s = IterationSummary(iteration=12, stage=1, epoch=0, forwards=5, backwards=5, compute_seconds=0.2542,
                         seconds=0.62, tokens=5 * 8 * 63)
    assert iteration_line(s) == ("iteration 12  stage 1  served 5 microbatches (fwd 5 / bwd 5)  compute 41% of "
                                 "0.62 s  4,065 tokens/s  epoch 0")


def test_an_idle_iteration_prints_zeroes_not_an_error():
    s = IterationSummary(iteration=0, stage=2, epoch=3, forwards=0, backwards=1, compute_seconds=0.0, seconds=0.0,
                         tokens=0)
    assert iteration_line(s) == ("iteration 0  stage 2  served 1 microbatch (fwd 0 / bwd 1)  compute 0% of 0.00 s  "
                                 "0 tokens/s  epoch 3")


def test_console_lines_bypass_the_log_file(tmp_path):
    out, log = io.StringIO(), tmp_path / "peer.log"
    root = logging.getLogger()
    handler = logging.FileHandler(log)
    root.addHandler(handler)
    try:
        install_console(out)
        console_logger.info("iteration 1 ...")
    finally:
        root.removeHandler(handler)
        handler.close()
        console_logger.handlers.clear()
        console_logger.propagate = True
    assert out.getvalue() == "iteration 1 ...\n" and "iteration 1" not in log.read_text()


def test_the_timeline_counts_compute_without_a_trace_file():
    t = Timeline(None, peer="A")
    t.record("inject", 0.0, 0.1)
    t.record("forward", 1.0, 1.2)
    t.record("loss", 2.0, 2.05)
    t.record("backward", 3.0, 3.3)
    t.record("send_forward", 4.0, 9.0)
    forwards, backwards, seconds = t.take_compute()
    assert (forwards, backwards) == (2, 1) and abs(seconds - 0.65) < 1e-9
    assert t.take_compute() == (0, 0, 0.0)
