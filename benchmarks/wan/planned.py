"""The WAN benchmark's comparison without the runtime: what the coordinator would plan, per method and peer count.

    .venv/bin/python benchmarks/wan/planned.py [--peers 12,13,20,40] [--emulate-model 1.5b] [--methods ...]

For each peer count, peers with the profile's links (as exact measurements) and the emulated preset's compute
and message size are planned by the coordinator's own `Replanner`, method by method (SkipPipe, and the full
pipeline on its own placement carrying the same work); the planned iteration is the planner's simulation (the
expected makespan under no jitter). Reports tokens/s and layer-work/s (tokens x stages visited) per method and the
ratio of SkipPipe's iteration to the full pipeline's. A simulation, not a measurement: `run.py` measures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.wan.run import LABELS, add_swarm_arguments, emulation  # noqa: E402
from peers.data import DataConfig  # noqa: E402
from scheduler.constants import LOSS_FACTOR  # noqa: E402
from scheduler.profiles import swarm_from  # noqa: E402
from swarm.coordinator.replanner import Replanner  # noqa: E402
from swarm.run_config import RunConfig  # noqa: E402
from swarm.wire import PeerRecord, PeerState  # noqa: E402

METHODS = ("skippipe", "full-pipeline")


def records(args: argparse.Namespace, peers: int, speed_scale: float) -> dict[str, PeerRecord]:
    """`peers` records whose links and speeds are the profile's (the loss step at LOSS_FACTOR x a stage)."""
    view = swarm_from(args.profile, peers, seed=args.seed)
    ids = [f"peer-{i:02d}" for i in range(peers)]
    return {p: PeerRecord(peer_id=p, stage=-1, seconds_per_layer=view.peers[i].seconds_per_layer * speed_scale,
                          loss_seconds=LOSS_FACTOR * view.peers[i].seconds_per_layer * speed_scale,
                          memory_slots=3, state=PeerState.ONLINE,
                          links={q: (float(view.latency[i, j]), float(view.bandwidth[i, j]))
                                 for j, q in enumerate(ids) if j != i})
            for i, p in enumerate(ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_swarm_arguments(parser, METHODS)
    parser.set_defaults(emulate_model="1.5b")
    parser.add_argument("--peers-list", default="12,13,20,40", help="peer counts to plan for")
    parser.add_argument("--out", default="runs/wan-planned.json")
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    if set(methods) - set(METHODS):
        sys.exit(f"error: methods must be among {', '.join(METHODS)}")
    scale = emulation(args)
    rows = []
    for n in (int(x) for x in args.peers_list.split(",")):
        recs = records(args, n, scale)
        row = {"peers": n}
        for method in methods:
            cfg = RunConfig(run_id="planned", model="tiny", stages=args.stages, skip=args.skip,
                            microbatches=args.microbatches, planner=method, seed=args.seed,
                            data=DataConfig(seq_len=args.seq_len, batch_size=args.batch_size),
                            message_bytes=args.message_bytes)
            cfg.validate()
            t0 = time.perf_counter()
            s = Replanner(cfg, cfg.to_spec(coordinator="c", vocab_size=4096).model).plan(recs, epoch=0,
                                                                                         start_iteration=0)
            it = s.predicted_iteration_seconds
            row[method] = {"planned_s": it, "plan_seconds": round(time.perf_counter() - t0, 2),
                           "microbatches": len(s.routes),
                           "groups": np.bincount(list(s.placement.values()), minlength=args.stages).tolist(),
                           "paths": len({r.peers for r in s.routes}),
                           "tokens_per_s": len(s.routes) * args.microbatch_tokens / it,
                           "layer_work_per_s": sum(len(r.stages) + 1 for r in s.routes) * args.microbatch_tokens / it}
            m = row[method]
            print(f"{n:3d} peers, {LABELS[method]:>20}: planned {it:.2f} s/iteration, {m['microbatches']} "
                  f"microbatches on {m['paths']} distinct paths, groups {m['groups']}; {m['tokens_per_s']:.0f} "
                  f"tokens/s, {m['layer_work_per_s']:.0f} layer-tokens/s (planned in {m['plan_seconds']:.1f} s)",
                  flush=True)
        if "skippipe" in row and "full-pipeline" in row:
            row["ratio"] = row["skippipe"]["planned_s"] / row["full-pipeline"]["planned_s"]
            print(f"{n:3d} peers: SkipPipe / full pipeline, planned: {row['ratio']:.2f}x", flush=True)
        rows.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                          "args": vars(args), "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
