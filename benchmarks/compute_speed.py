"""How fast a local swarm's machine computed, from its peers' traces: the median time of one compute op (inject,
forward, backward, loss) in each committed iteration.

Two runs of one plan on one machine compute alike. When they do not before anything differs between them (in the
churn benchmark: before the first death), something outside the runs loaded the machine (another job, a busy
neighbour VM), and the throughput ratio between the runs measures that too. `speed_ratio` says by how much.

    .venv/bin/python benchmarks/compute_speed.py STEADY_RUN_DIR CHURN_RUN_DIR [--first-iterations N]

prints, for two kept run directories of the churn benchmark (`--work-dir`), the median op time of each over their
first N iterations (default: those committed before the churn run's first death, from its coordinator's events),
and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

COMPUTE_OPS = ("inject", "forward", "backward", "loss")
"""Trace spans that are computation on a peer (sends, averaging and commits wait on others too)."""


def compute_ms(run_dir: Path) -> dict[int, float]:
    """Committed iteration (1-based, as metrics.jsonl counts) -> median milliseconds of its compute ops, over every
    peer's trace (`peer-*.trace.jsonl`) in `run_dir`; lines that are not spans are skipped."""
    spans: dict[int, list[float]] = {}
    for path in sorted(run_dir.glob("peer-*.trace.jsonl")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    span = json.loads(line)
                    if span.get("kind") in COMPUTE_OPS:
                        seconds = float(span["end"]) - float(span["start"])
                        spans.setdefault(int(span["iteration"]) + 1, []).append(seconds * 1000.0)
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
    return {iteration: statistics.median(ms) for iteration, ms in sorted(spans.items())}


def speed_ratio(steady: list[float], churned: list[float], first: int) -> float | None:
    """How much slower (> 1) the churn run's machine computed than the steady run's over their first `first`
    iterations (per-iteration medians, `compute_ms`, in commit order); None without any to compare."""
    a, b = [x for x in steady[:first] if x > 0], [x for x in churned[:first] if x > 0]
    if not a or not b:
        return None
    return statistics.median(b) / statistics.median(a)


def first_death_iteration(run_dir: Path) -> int | None:
    """Iterations a churn run surely committed before its first death, from its coordinator's view: those committed
    `DETECTION_MARGIN` seconds before it declared the first peer gone; None if it declared nobody gone. (The churn
    benchmark itself records the death's time: this is for run directories kept from before it did.)"""
    events = [json.loads(line) for line in open(run_dir / "coordinator.events.jsonl", encoding="utf-8")]
    gone = [e["time"] for e in events if e.get("event") == "declared_gone"]
    if not gone:
        return None
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl", encoding="utf-8")]
    return sum(r["time"] < min(gone) - DETECTION_MARGIN for r in records)


DETECTION_MARGIN = 10.0
"""Seconds a death takes at most to be declared in the churn benchmark's swarms (a frozen peer: ~6 s)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steady", type=Path)
    parser.add_argument("churned", type=Path)
    parser.add_argument("--first-iterations", type=int, default=None)
    args = parser.parse_args()
    first = args.first_iterations or first_death_iteration(args.churned)
    if not first:
        sys.exit("error: no first death found in the churn run: pass --first-iterations")
    steady, churned = (list(compute_ms(d).values()) for d in (args.steady, args.churned))
    ratio = speed_ratio(steady, churned, first)
    print(f"first {first} iterations: compute op median {statistics.median(steady[:first]):.1f} ms (steady) vs "
          f"{statistics.median(churned[:first]):.1f} ms (churn): x{ratio:.3f}; over the whole runs "
          f"{statistics.median(steady):.1f} vs {statistics.median(churned):.1f} ms")


if __name__ == "__main__":
    main()
