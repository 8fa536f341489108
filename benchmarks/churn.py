"""Churn benchmark: training throughput under a seeded churn trace, against the same run without churn, for
SkipPipe and for the full pipeline.

    .venv/bin/python benchmarks/churn.py [--peers 8] [--minutes 3] [--rate 0.1] [--seed 0]

Each run is a real local swarm (coordinator and peer processes on loopback). After the first iteration is
committed, a window of `--minutes` starts; in the churn runs, peers are killed (kill -9: the whole process
tree, as when a machine dies) at the times of a seeded trace of `--rate` x peers failures per minute,
and each is replaced by a new peer `--rejoin` seconds later (volunteer swarms keep their size on average).
Throughput is the tokens of the iterations committed within the window over its length. The churn run starts from
the plan its churn-free run drew (`--first-schedule`): each run plans on the links it measures, and two plans of
one method can differ by more than the churn costs. The data holders' ledgers are checked as well: every sample
handed out must have been processed exactly once.
Prints, per method, tokens/s without and with churn and the fraction kept (target: SkipPipe keeps >= 70% at
10% of peers per minute, and more than the full pipeline keeps).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from peers.data_ledger import read_ledger, sample_status  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402

METHODS = {"skippipe": 0.33, "full-pipeline": 0.0}
"""Method -> skip ratio of its run."""


def churn_trace(seed: int, peers: int, seconds: float, rate: float) -> list[float]:
    """Failure times (seconds into the window): at least `rate` x `peers` failures per minute (rounded up), evenly
    spread with seeded jitter (a Poisson draw over a few minutes can miss the stated rate by half)."""
    rng = random.Random(seed)
    count = math.ceil(rate * peers * seconds / 60.0 - 1e-9)
    gap = seconds / count if count else 0.0
    return [gap * (k + 0.5 + rng.uniform(-0.25, 0.25)) for k in range(count)]


def run(args: argparse.Namespace, method: str, churn: bool, root: Path, first_schedule: Path | None = None) -> dict:
    run_dir = root / f"{method}-{'churn' if churn else 'steady'}"
    config = root / f"{method}.toml"
    config.write_text(f"""
[run]
run_id = "churn-{method}"
stages = {args.stages}
skip = {METHODS[method]}
microbatches = 2
iterations = 0
min_peers = {args.peers}
seed = {args.seed}

[swarm]
planner = "{method}"
heartbeat = 1.0
""")

    def peer_args(i: int) -> list[str]:
        return ["--iteration-deadline", "120", "--ledger", str(run_dir / f"ledger-{i:02d}.jsonl")]

    if first_schedule:  # the same machines as the run that drew it: the same keys
        run_dir.mkdir(parents=True, exist_ok=True)
        for key in first_schedule.parent.glob("*.key"):
            shutil.copy(key, run_dir / key.name)

    swarm = LocalSwarm(run_dir, args.peers, run_id=f"churn-{method}",
                       coordinator_args=["--config", str(config), *saved_plan_args(first_schedule)],
                       peer_args=[peer_args(i) for i in range(args.peers)])
    failures = churn_trace(args.seed, args.peers, args.minutes * 60, args.rate) if churn else []
    try:
        swarm.start()
        swarm.watch(1, timeout=300)
        start, killed, joined = play_trace(swarm, failures, args.minutes * 60, args.rejoin, args.seed,
                                           peer_args)
        records = swarm.metrics()
    finally:
        swarm.stop()
    return {"method": method, "churn": churn, **window_summary(run_dir, records, start, args.minutes * 60),
            "killed": killed, "joined": joined}


def saved_plan_args(first_schedule: Path | None) -> list[str]:
    """The coordinator's flags to start from `first_schedule` (a run's plan): none when there is none."""
    return ["--first-schedule", str(first_schedule)] if first_schedule else []


def first_plan(run_dir: Path) -> Path:
    """The plan a run started from (to start another run of the same peers from it)."""
    return run_dir / "schedule-0.json"


def play_trace(swarm: LocalSwarm, failures: list[float], window: float, rejoin: float, seed: int,
               joiner_args: Callable[[int], list[str]]) -> tuple[float, int, int]:
    """From now on for `window` seconds: kill -9 a random live peer at each failure time and add a new peer
    `rejoin` seconds after each. Returns the window's start (wall clock) and how many were killed and joined."""
    events = sorted([(t, "kill") for t in failures] + [(t + rejoin, "join") for t in failures])
    rng = random.Random(seed + 1)
    killed, joined = 0, 0
    start = time.time()
    for at, kind in events:
        if at >= window:
            break
        time.sleep(max(0.0, start + at - time.time()))
        if kind == "kill":
            live = [p for p in swarm.peers if p.poll() is None]
            if len(live) > 2:
                swarm.kill(rng.choice(live))
                killed += 1
        else:
            index = len(swarm.peers)
            swarm.add_peer(index, joiner_args(index))
            joined += 1
    time.sleep(max(0.0, start + window - time.time()))
    return start, killed, joined


def kept(steady: dict, churned: dict) -> tuple[float, float]:
    """The fraction of its churn-free throughput a method kept under churn, and the same at equal plans (each
    throughput times its window's mean planned iteration): the first is what a user sees; the second leaves out
    how the re-plans' placements drifted from the first plan (slower for the epochs a death shrank, sometimes
    faster when a forced move happened to suit the method), so that it shows what the deaths cost the runtime."""
    nan = float("nan")
    raw = churned["tokens_per_s"] / steady["tokens_per_s"] if steady["tokens_per_s"] else nan
    plans = steady.get("planned_s"), churned.get("planned_s")
    return raw, raw * plans[1] / plans[0] if all(plans) else nan


def window_summary(run_dir: Path, records: list[dict], start: float, window: float) -> dict:
    """Tokens/s of the iterations committed within the window, and how often the holders' ledgers say each sample
    handed out was processed (exactly once for every sample, or something was lost or doubled)."""
    inside = [r for r in records if start < r["time"] <= start + window]
    tokens = sum((r["tokens_per_s"] or 0) * r["iteration_seconds"] for r in inside)
    predicted = {int(f.stem.split("-")[1]): json.loads(f.read_text()).get("predicted_iteration_seconds")
                 for f in run_dir.glob("schedule-*.json")}
    planned = [predicted[r["epoch"]] for r in inside if predicted.get(r["epoch"])]
    entries = [e for f in sorted(run_dir.glob("ledger-*.jsonl")) for e in read_ledger(f)]
    status = sample_status(entries, {(r["iteration"] - 1, r["epoch"]) for r in records})
    processed = Counter(c["processed"] for c in status.values())
    return {"tokens_per_s": tokens / window, "iterations": len(inside),
            "planned_s": sum(planned) / len(planned) if planned else None,
            "epochs": records[-1]["epoch"] + 1 if records else 0,
            "samples_processed_times": {str(k): v for k, v in sorted(processed.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=3.0, help="length of the measured window")
    parser.add_argument("--rate", type=float, default=0.1, help="failures per peer per minute")
    parser.add_argument("--rejoin", type=float, default=20.0, help="seconds until a killed peer is replaced")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    if set(methods) - set(METHODS):
        sys.exit(f"error: methods must be among {', '.join(METHODS)}")
    trace = churn_trace(args.seed, args.peers, args.minutes * 60, args.rate)
    print(f"{args.peers} peers, {args.stages} stages, {args.minutes:g} min window; churn trace (seed {args.seed}): "
          f"failures at {', '.join(f'{t:.0f}' for t in trace)} s, each replaced {args.rejoin:g} s later", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in methods:
            steady = run(args, method, False, Path(tmp))
            churned = run(args, method, True, Path(tmp), first_plan(Path(tmp) / f"{method}-steady"))
            share, at_plan = kept(steady, churned)
            results += [steady, churned]
            print(f"{method:>14}: {steady['tokens_per_s']:.0f} tokens/s without churn, {churned['tokens_per_s']:.0f} "
                  f"with churn ({churned['killed']} killed, {churned['joined']} joined, {churned['epochs']} epochs): "
                  f"keeps {share:.0%} ({at_plan:.0%} at equal plans); samples processed (times: count) steady "
                  f"{steady['samples_processed_times']}, churn {churned['samples_processed_times']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": vars(args),
                                              "results": results}, indent=1))


if __name__ == "__main__":
    main()
