"""Local swarm start-up: peers forked from a warm starter vs peers started cold, on this machine.

    .venv/bin/python benchmarks/swarm_start.py [--peers 6] [--runs 3]

Each run starts a local swarm (coordinator + N peers on loopback, tiny model, 3 stages) and times, from
`LocalSwarm.start()`: every peer admitted (the coordinator's `admitted` events), the first plan, the first commit.
At the first commit it also sums the CPU time (user + system) of every process the launcher started and their
descendants, the warm starter included: the work, not only its spread over the cores. Runs alternate cold / warm,
so a drift of the machine's load hits both. Prints min / median / max per method and the warm / cold ratio of the
medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds of `pids` and all their descendants, each process counted once (forked peers are also the
    starter's descendants)."""
    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        except psutil.NoSuchProcess:
            pass
    total = 0.0
    for p in procs.values():
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def one_run(peers: int, warm: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "run.toml"
        config.write_text(f"[run]\nrun_id = 'start'\nstages = 3\nskip = 0.33\nmicrobatches = 1\niterations = 3\n"
                          f"min_peers = {peers}\n")
        swarm = LocalSwarm(Path(tmp) / "run", peers, run_id="start", coordinator_args=["--config", str(config)],
                           warm_start=warm)
        t0 = time.time()
        try:
            swarm.start()
            while not swarm.metrics():
                if time.time() - t0 > 600:
                    raise TimeoutError("no commit in 600 s")
                time.sleep(0.05)
            first_commit = time.time() - t0
            roots = [p.pid for p in swarm.processes] + ([swarm.starter.proc.pid] if swarm.starter else [])
            cpu = tree_cpu(roots)
            admitted = [e["time"] - t0 for e in swarm.events("admitted", who="coordinator")]
        finally:
            swarm.stop()
    return {"warm": warm, "all_admitted_s": round(max(admitted), 2), "first_commit_s": round(first_commit, 2),
            "cpu_s": round(cpu, 1)}


def spread(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def main() -> None:
    unwind_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write every run's figures here (JSON)")
    args = ap.parse_args()
    if not 1 <= args.peers <= 32 or not 1 <= args.runs <= 20:
        sys.exit("error: --peers 1-32, --runs 1-20")
    runs = []
    for i in range(args.runs):
        for warm in (False, True):
            runs.append(one_run(args.peers, warm))
            print(f"run {i + 1} {'warm' if warm else 'cold'}: {runs[-1]}", flush=True)
    print(f"\n{args.peers} peers, {args.runs} runs each (min / median / max):")
    medians = {}
    for warm in (False, True):
        mine = [r for r in runs if r["warm"] is warm]
        name = "warm" if warm else "cold"
        for key in ("all_admitted_s", "first_commit_s", "cpu_s"):
            values = [r[key] for r in mine]
            medians[(name, key)] = statistics.median(values)
            print(f"  {name} {key:15s} {spread(values)}")
    for key in ("all_admitted_s", "first_commit_s", "cpu_s"):
        print(f"  warm / cold {key:15s} {medians[('warm', key)] / medians[('cold', key)]:.2f}x")
    if args.out:
        args.out.write_text(json.dumps({"peers": args.peers, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
