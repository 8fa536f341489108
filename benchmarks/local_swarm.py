"""Local swarm vs in-process swarm: iteration time on the same schedule, and memory per peer process tree.

    .venv/bin/python benchmarks/local_swarm.py [--peers 6] [--iterations 20] [--runs 3]

Each run starts a real local swarm (coordinator + peer processes on loopback: DHT, p2pd, gossip sidecars), samples
the resident memory of each peer's process tree (the peer, its p2pd, its gossip sidecar) while it trains,
then runs the in-process swarm on the very schedule the coordinator planned, with the same data and seed.

Both sides are timed over the same span, one whole iteration through the optimizer step. In-process, that is
`run_iteration().seconds`. In the local swarm, it is the interval between two consecutive commits, which covers
the pipeline, the commit, the stage averaging and the step. The metrics line's own `iteration_seconds` (first
holder's start to last holder's finish, before commit, averaging and step) is printed too, for reference. Prints
min/median/max over the runs of each median and of the ratio (target: local <= 1.5x in-process).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from peers.data import Corpus  # noqa: E402
from peers.inprocess import InProcessSwarm  # noqa: E402
from scheduler.schedule import Schedule  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.run_config import RunConfig  # noqa: E402


def tree_rss(pid: int) -> int:
    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
    except psutil.NoSuchProcess:
        return 0


def one_run(args: argparse.Namespace) -> dict:
    flags = ["--iterations", str(args.iterations), "--min-peers", str(args.peers), "--stages", str(args.stages),
             "--skip", str(args.skip), "--microbatches", str(args.microbatches), "--seed", "0"]
    with tempfile.TemporaryDirectory() as tmp:
        run = LocalSwarm(tmp, args.peers, run_id="bench", coordinator_args=flags)
        peak: dict[int, int] = {}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                for p in run.peers:
                    peak[p.pid] = max(peak.get(p.pid, 0), tree_rss(p.pid))
                coordinator = run.coordinator.pid if run.coordinator else None
                if coordinator:
                    peak[coordinator] = max(peak.get(coordinator, 0), tree_rss(coordinator))
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        try:
            run.start()
            sampler.start()
            records = run.watch(args.iterations, timeout=300)
            schedule = Schedule.from_json((Path(tmp) / "schedule-0.json").read_text())
        finally:
            stop.set()
            run.stop()
        coordinator_rss = peak.pop(run.coordinator.pid, 0)
    commits = [r["time"] for r in records]
    through_step = [b - a for a, b in zip(commits[2:], commits[3:])]  # commit to commit, after two warm-ups
    config = RunConfig.from_tables({}, iterations=args.iterations, stages=args.stages, skip=args.skip, seed=0,
                                   microbatches=args.microbatches, min_peers=args.peers)
    corpus = Corpus.build(config.data)
    swarm = InProcessSwarm(schedule, config.model_config(corpus.vocab_size), config.optim, corpus=corpus, seed=0)
    inproc = [swarm.run_iteration(order="interleaved").seconds for _ in range(args.iterations)][2:]
    mib = [v / 2**20 for v in peak.values()]
    return {"local": statistics.median(through_step), "stamped": statistics.median(r["iteration_seconds"]
                                                                                     for r in records[2:]),
            "inprocess": statistics.median(inproc), "routes": len(schedule.routes), "loss": records[-1]["loss"],
            "tree_mib": statistics.median(mib), "tree_mib_max": max(mib), "coordinator_mib": coordinator_rss / 2**20}


def spread(values: list[float]) -> str:
    return f"min {min(values):.3f} / median {statistics.median(values):.3f} / max {max(values):.3f}"


def main() -> None:
    unwind_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=6)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--skip", type=float, default=0.33)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = [one_run(args) for _ in range(args.runs)]
    print(f"local swarm: {args.peers} peers, {args.stages} stages, skip {args.skip}, {runs[0]['routes']} "
          f"microbatches/iteration, tiny model; {args.iterations} iterations, {args.runs} runs")
    print(f"local swarm, commit to commit (s): {spread([r['local'] for r in runs])}")
    print(f"local swarm, stamped pipeline span, before commit/averaging/step (s): "
          f"{spread([r['stamped'] for r in runs])}")
    print(f"in-process, whole iteration on the same schedule (s): {spread([r['inprocess'] for r in runs])}")
    print(f"ratio local / in-process, same span: {spread([r['local'] / r['inprocess'] for r in runs])} "
          f"(target <= 1.5x)")
    print(f"final loss: local {runs[-1]['loss']:.4f}")
    print(f"peak RSS per peer process tree (peer + p2pd + gossip sidecar): median "
          f"{statistics.median(r['tree_mib'] for r in runs):.0f} MiB, max {max(r['tree_mib_max'] for r in runs):.0f} "
          f"MiB; coordinator tree {statistics.median(r['coordinator_mib'] for r in runs):.0f} MiB")


if __name__ == "__main__":
    main()
