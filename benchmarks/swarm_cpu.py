"""Where a local swarm's CPU goes, by kind of process, and how many iterations it gets through, on this machine.

    .venv/bin/python benchmarks/swarm_cpu.py [--peers 8] [--runs 3] [--window 30] [--heartbeat 1.0]

Each run starts a local swarm on loopback (coordinator + N peers, tiny model, 3 stages, skip 0.33, one microbatch
per holder: the shape of the end-to-end tests) and, once iteration 3 is committed, reads the CPU time of every
process of every peer tree and of the coordinator's tree over a `--window` of seconds. It prints, per kind
(`benchmarks.wan.footprint.kind_of`: peer, dht, gossip sidecar, p2pd, helpers; the coordinator's tree as one; the
processes the peers and the sidecars are forked from), the cores used over the window, and the iterations
committed in it, min / median / max over the runs. With `--idle` the swarm waits for one peer more than it has, so
the window sees peers that have joined and wait to be placed: the floor a swarm pays before any training. With
`--start` it reads instead the CPU seconds every process spent from the launch to the first commit (sampled every
0.3 s: a process that lives less than that may be missed), and how long that took: what each swarm start of the
end-to-end tests costs. To compare two versions of the code, run this script in an export of each (the figures are
this machine's, so run them one after the other).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from benchmarks.wan.footprint import KINDS, kind_of  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402

COORDINATOR = "coordinator"
WARM_STARTER, SIDECAR_STARTER = "warm starter", "sidecar starter"
"""The launcher's processes the peers and the gossip sidecars are forked from: the first's children are the peers
(counted as their own trees), the second's are sidecars."""
ROLES = (COORDINATOR, WARM_STARTER, SIDECAR_STARTER)


def roots_of(swarm: LocalSwarm) -> dict[int, str]:
    """pid -> role of every tree a local swarm's CPU is spent in: peers, the coordinator and the starters."""
    roots = {p.pid: "peer" for p in swarm.peers}
    for proc, role in ((getattr(swarm, "starter", None), WARM_STARTER),
                       (getattr(swarm, "sidecars", None), SIDECAR_STARTER)):
        if proc is not None:
            roots[proc.proc.pid] = role
    roots[swarm.coordinator.pid] = COORDINATOR
    return roots


def cpu_by_kind(roots: dict[int, str]) -> dict[int, tuple[str, float]]:
    """pid -> (kind, user + system CPU seconds) for every process of the trees rooted at `roots` (pid -> role:
    "peer", the coordinator or a starter). A sidecar forked by the sidecar starter counts as a gossip sidecar, the
    coordinator's too."""
    out = {}
    for root_pid, role in roots.items():
        try:
            root = psutil.Process(root_pid)
            procs = [root] if role == WARM_STARTER else [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                if role in ROLES:
                    kind = role if proc.pid == root_pid or role == COORDINATOR else "gossip sidecar"
                else:
                    kind = kind_of(proc, root_pid)
                t = proc.cpu_times()
                out[proc.pid] = (kind, t.user + t.system)
            except psutil.Error:
                continue
    return out


def one_run(args: argparse.Namespace, root: Path, index: int) -> dict:
    run_dir = root / f"run-{index}"
    run_dir.mkdir(parents=True)
    min_peers = args.peers + 1 if args.idle else args.peers
    config = run_dir / "run.toml"
    config.write_text(f"[run]\nrun_id = 'cpu'\nstages = 3\nskip = 0.33\nmicrobatches = 1\niterations = 100000\n"
                      f"min_peers = {min_peers}\n[swarm]\nheartbeat = {args.heartbeat}\n")
    swarm = LocalSwarm(run_dir / "swarm", args.peers, run_id="cpu", coordinator_args=["--config", str(config)])
    if args.start:
        return start_run(swarm)
    try:
        swarm.start()
        deadline = time.monotonic() + 600
        if args.idle:
            time.sleep(args.settle)
        else:
            while len(swarm.metrics()) < 3:
                if time.monotonic() > deadline:
                    raise TimeoutError("no third commit within 600 s")
                time.sleep(0.2)
        roots = roots_of(swarm)
        before, committed = cpu_by_kind(roots), len(swarm.metrics())
        time.sleep(args.window)
        after, iterations = cpu_by_kind(roots), len(swarm.metrics()) - committed
    finally:
        swarm.stop()
    cores: dict[str, float] = defaultdict(float)
    for pid, (kind, seconds) in after.items():
        if pid in before:  # a process started inside the window has no baseline: left out
            cores[kind] += (seconds - before[pid][1]) / args.window
    return {"cores": {k: round(v, 3) for k, v in cores.items()}, "total_cores": round(sum(cores.values()), 3),
            "iterations": iterations}


def start_run(swarm: LocalSwarm) -> dict:
    """CPU seconds by kind from `swarm`'s launch to its first commit (each process at its last reading), and the
    seconds that took."""
    began, last = time.monotonic(), {}
    try:
        swarm.start()
        while not swarm.metrics():
            if time.monotonic() - began > 600:
                raise TimeoutError("no first commit within 600 s")
            last.update(cpu_by_kind(roots_of(swarm)))
            time.sleep(0.3)
        seconds = time.monotonic() - began
    finally:
        swarm.stop()
    cpu: dict[str, float] = defaultdict(float)
    for kind, used in last.values():
        cpu[kind] += used
    return {"cpu_seconds": {k: round(v, 2) for k, v in cpu.items()}, "total_cpu_seconds": round(sum(cpu.values()), 2),
            "processes": len(last), "seconds_to_first_commit": round(seconds, 2)}


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    unwind_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window", type=float, default=30.0, help="seconds over which CPU time is read")
    ap.add_argument("--heartbeat", type=float, default=1.0, help="the run's heartbeat (the tests use 1 s)")
    ap.add_argument("--idle", action="store_true", help="peers wait to be placed: no training in the window")
    ap.add_argument("--settle", type=float, default=30.0, help="with --idle: seconds after start before the window")
    ap.add_argument("--start", action="store_true", help="CPU seconds from the launch to the first commit")
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    if args.peers < 3 or args.runs < 1 or args.window <= 0 or args.heartbeat <= 0:
        ap.error("need --peers >= 3, --runs >= 1, a positive --window and --heartbeat")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            runs.append(one_run(args, Path(tmp), i))
            print(json.dumps(runs[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    if args.start:
        print(f"\n{args.peers} peers, heartbeat {args.heartbeat} s, launch to first commit, {args.runs} runs: "
              f"CPU seconds min / median / max")
        for kind in (*KINDS, *ROLES):
            print(f"  {kind:15s} {spread([r['cpu_seconds'].get(kind, 0.0) for r in runs])}")
        print(f"  {'all':15s} {spread([r['total_cpu_seconds'] for r in runs])}")
        print(f"  processes       {spread([r['processes'] for r in runs])}")
        print(f"  seconds to the first commit: {spread([r['seconds_to_first_commit'] for r in runs])}")
        return
    print(f"\n{args.peers} peers, heartbeat {args.heartbeat} s, {'idle' if args.idle else 'training'}, "
          f"{args.window:.0f} s window, {args.runs} runs: cores min / median / max")
    for kind in (*KINDS, *ROLES):
        values = [r["cores"].get(kind, 0.0) for r in runs]
        print(f"  {kind:15s} {spread(values)}")
    print(f"  {'all':15s} {spread([r['total_cores'] for r in runs])}")
    if not args.idle:
        print(f"  iterations in the window: {spread([r['iterations'] for r in runs])}")


if __name__ == "__main__":
    main()
