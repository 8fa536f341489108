"""Silent deaths (issue #19): what one dead peer costs the iteration it dies in, frozen (silent) vs kill -9 (loud).

    .venv/bin/python benchmarks/silent_death.py [--peers 6] [--runs 3] [--modes freeze,kill] [--after 6]
        [--emulate-speed SECONDS_PER_LAYER]

Each run is a real local swarm (coordinator and peer processes on loopback, 3 stages, 33% skip, 2 microbatches
per holder). Once iteration `--after` is committed, one peer that relays microbatches and has a stage mate (so
the swarm can go on without it) dies:

- `freeze`: its whole process tree (the peer, its p2pd, DHT process and gossip sidecar) is stopped with SIGSTOP.
  Nothing is reset, its sockets stay open: only timeouts tell, as when a host or its link dies.
- `kill`: the whole tree is killed (SIGKILL): its connections are reset and new ones refused at once.

The stall is the longest gap between two commits from the last one before the death on (the iteration the death
stalls, whichever it is), against the median gap between commits before the death (the measured period) and the
schedule's planned iteration. `--emulate-speed` pads each peer's operations to that many seconds per layer, for
iterations long enough that the detection's fixed floors (a few seconds) no longer dominate. Also printed: how
long until the scheduler declared the peer gone (`declared_gone`). Prints min/median/max over the runs per mode,
and the ratio of the frozen stall to the killed one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.repetitions import alternate, repetition_parser  # noqa: E402
from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from swarm.local.local_swarm import LocalSwarm  # noqa: E402
from swarm.net.identity import ensure_identity  # noqa: E402

MODES = ("freeze", "kill")


def victim(swarm: LocalSwarm) -> int:
    """Index of a peer outside stage 0 that the routes go through and whose stage keeps another peer."""
    schedule = swarm.schedule()
    where = schedule["placement"]
    busy = {p for r in schedule["routes"] for p in r["peers"]}
    ids = {ensure_identity(str(swarm.run_dir / f"peer-{i:02d}.key")): i for i in range(len(swarm.peers))}
    return next(i for pid, i in sorted(ids.items(), key=lambda kv: kv[1])
                if where.get(pid, 0) != 0 and pid in busy and list(where.values()).count(where[pid]) > 1)


def stall_figures(records: list[dict], died_at: float, after: int, planned: float | None) -> dict:
    """The longest commit gap from the last commit before the death on, the median gap before it, and the slowest
    recorded iteration after it."""
    times = [r["time"] for r in records]
    before = [b - a for a, b in zip(times[1:after], times[2:after])]  # iterations 2..after: past the start-up
    since = [t for t in times if t >= max(t for t in times if t <= died_at)]
    later = [r["iteration_seconds"] for r in records if r["time"] > died_at]
    return {"stall_s": round(max(b - a for a, b in zip(since, since[1:])), 3),
            "period_s": round(statistics.median(before), 3), "planned_s": planned, "slowest_iteration_s": max(later)}


def run(args: argparse.Namespace, mode: str, index: int, root: Path) -> dict:
    run_dir = root / f"{mode}-{index}"
    config = root / "run.toml"
    config.write_text(f"[run]\nrun_id = 'silent'\nstages = 3\nskip = 0.33\nmicrobatches = 2\n"
                      f"iterations = {args.after + args.then}\nmin_peers = {args.peers}\nseed = {index}\n")
    swarm = LocalSwarm(run_dir, args.peers, run_id="silent", coordinator_args=["--config", str(config)],
                       peer_args=["--iteration-deadline", "120",
                                  *(["--emulate-speed", str(args.emulate_speed)] if args.emulate_speed else [])])
    tree = []
    try:
        swarm.start()
        swarm.watch(args.after, timeout=600)
        planned = swarm.schedule().get("predicted_iteration_seconds")
        dead = victim(swarm)
        died_at = time.time()
        if mode == "freeze":
            tree = swarm.freeze(swarm.peers[dead])
        else:
            swarm.kill(swarm.peers[dead])
        records = swarm.watch(args.after + args.then, timeout=600)
        gone = [e for e in swarm.events("declared_gone", who="coordinator")
                if e["peer"] == ensure_identity(str(run_dir / f"peer-{dead:02d}.key"))]
    finally:
        if tree:
            swarm.kill(swarm.peers[dead])  # resumed and killed with its whole tree
        swarm.stop()
    return {"mode": mode, "run": index, **stall_figures(records, died_at, args.after, planned),
            "declared_gone_after_s": round(gone[0]["time"] - died_at, 3) if gone else None,
            "why": gone[0]["why"] if gone else None}


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    unwind_on_sigterm()
    parser = repetition_parser(__doc__, MODES)
    parser.add_argument("--after", type=int, default=6, help="the peer dies once this iteration is committed")
    parser.add_argument("--then", type=int, default=6, help="iterations run after the death")
    parser.add_argument("--emulate-speed", type=float, default=None,
                        help="pad each peer's operations to this many seconds per layer (longer iterations)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES) or args.after < 3:
        sys.exit(f"error: modes must be among {', '.join(MODES)}, --after at least 3")
    results = alternate(args, modes, run)
    for mode in modes:
        mine = [r for r in results if r["mode"] == mode]
        gone = [r["declared_gone_after_s"] for r in mine if r["declared_gone_after_s"] is not None]
        print(f"{mode:>6}: stall {spread([r['stall_s'] for r in mine])} s (min/median/max) vs commit period "
              f"{spread([r['period_s'] for r in mine])} s, planned {spread([r['planned_s'] or 0 for r in mine])} s; "
              f"declared gone after {spread(gone) if gone else '-'} s ({len(gone)}/{len(mine)} runs)")
    if set(modes) == set(MODES):
        ratio = statistics.median(r["stall_s"] for r in results if r["mode"] == "freeze") / \
            statistics.median(r["stall_s"] for r in results if r["mode"] == "kill")
        print(f"median stall, frozen / killed: {ratio:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": vars(args),
                                              "results": results}, indent=1))


if __name__ == "__main__":
    main()
