"""Convergence and robustness of skipping, in the in-process swarm (no network).

Trains the same model twice on the same data for the same number of iterations: once with the
full pipeline (every microbatch visits every stage in order) and once with 33% skip on paths planned
by the scheduler (same placement, same data holders, so the same microbatches). Reports:

- validation loss curves (PNG) and the final validation loss of each (target: skip within 5%);
- robustness: validation perplexity with 50% of the non-zero stages omitted (stage 0 plus a random
  sorted subset per batch), for both models (target: the skip-trained one degrades clearly less).

    .venv/bin/python benchmarks/convergence.py              # tiny model, a few minutes on 2 CPU cores
    .venv/bin/python benchmarks/convergence.py --iterations 300 --model small --device cuda
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from peers.data import Corpus, DataConfig
from peers.inprocess import InProcessSwarm
from peers.model import FLAVORS
from peers.optim import OptimConfig
from peers.train import train_loop, validation_loss
from scheduler.path_rules import PathRules
from scheduler.planner import plan_for_profile
from scheduler.schedule import Route, Schedule, validate

RESULTS = Path(__file__).parent / "results"


def full_pipeline_like(schedule: Schedule) -> Schedule:
    """The same placement and microbatches, every route visiting all stages in order (peers in rotation)."""
    s = schedule.num_stages
    turn = dict.fromkeys(range(1, s), 0)
    routes = []
    for r in schedule.routes:
        peers = []
        for stage in range(1, s):
            group = schedule.stage_peers(stage)
            peers.append(group[turn[stage] % len(group)])
            turn[stage] += 1
        routes.append(Route(microbatch=r.microbatch, origin=r.origin, stages=tuple(range(1, s)), peers=tuple(peers),
                            inject_after=r.inject_after))
    full = dataclasses.replace(schedule, rules=PathRules(s, s, max_swaps=0), routes=tuple(routes),
                               planner="full_pipeline")
    validate(full)
    return full


def progress(name: str):
    def show(record: dict) -> None:
        if "val_loss" in record:
            print(f"  {name}: iteration {record['iteration']}, val loss {record['val_loss']:.4f}", flush=True)
    return show


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=sorted(FLAVORS))
    ap.add_argument("--peers", type=int, default=12)
    ap.add_argument("--stages", type=int, default=6)
    ap.add_argument("--skip", type=float, default=1 / 3)
    ap.add_argument("--iterations", type=int, default=80)
    ap.add_argument("--microbatches", type=int, default=4, help="per data holder per iteration")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--omit", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=RESULTS / "convergence.png")
    args = ap.parse_args()

    corpus = Corpus.build(DataConfig(seq_len=args.seq_len, batch_size=args.batch_size, seed=args.seed))
    cfg = dataclasses.replace(FLAVORS[args.model], vocab_size=corpus.vocab_size)
    skip_plan = plan_for_profile(num_peers=args.peers, num_stages=args.stages, skip=args.skip,
                                 microbatches_per_holder=args.microbatches, seed=args.seed, num_layers=cfg.n_layers)
    plans = {"full pipeline": full_pipeline_like(skip_plan), f"{args.skip:.0%} skip": skip_plan}
    optim = OptimConfig(lr=args.lr, warmup_steps=max(1, args.iterations // 20), total_steps=args.iterations)
    print(f"{args.model} ({cfg.num_params() / 1e6:.1f}M params), {args.peers} peers, {args.stages} stages, placement "
          f"{[len(skip_plan.stage_peers(s)) for s in range(args.stages)]}, {len(skip_plan.routes)} microbatches of "
          f"{args.batch_size}x{args.seq_len} tokens per iteration, {args.iterations} iterations")
    curves, summary = {}, {}
    for name, plan in plans.items():
        torch.manual_seed(args.seed)
        swarm = InProcessSwarm(plan, cfg, optim, corpus=corpus, device=args.device, seed=args.seed)
        start = time.perf_counter()
        records = train_loop(swarm, args.iterations, eval_every=args.eval_every, on_record=progress(name))
        seconds = time.perf_counter() - start
        curves[name] = [(r["iteration"], r["val_loss"]) for r in records if "val_loss" in r]
        robust = validation_loss(swarm, None, omit=args.omit, seed=args.seed)
        summary[name] = {"final_val_loss": robust["loss"], "perplexity": robust["perplexity"],
                         "perplexity_omitted": robust["perplexity_omitted"], "kept_stages": robust["kept_stages"],
                         "degradation": robust["perplexity_omitted"] / robust["perplexity"] - 1,
                         "train_seconds": seconds, "stage_visits": dict(plan.stage_visits())}
        print(f"{name:>14}: final val loss {robust['loss']:.4f}, ppl {robust['perplexity']:.2f}, "
              f"{args.omit:.0%} stages omitted ({robust['kept_stages']} of {args.stages - 1} kept): ppl "
              f"{robust['perplexity_omitted']:.2f} ({summary[name]['degradation']:+.1%}); {seconds:.0f} s")
    full, skip = summary.values()
    ratio = skip["final_val_loss"] / full["final_val_loss"] - 1
    print(f"final validation loss, skip vs full: {ratio:+.2%} (target within 5%); perplexity degradation with "
          f"{args.omit:.0%} omitted: skip-trained {skip['degradation']:+.1%} vs full-trained "
          f"{full['degradation']:+.1%}")
    print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary, "curves": curves}))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in curves.items():
        ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("validation loss")
    ax.set_title(f"{args.model}: full pipeline vs {args.skip:.0%} skip ({args.stages} stages)")
    ax.legend()
    ax.grid(alpha=0.3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"plot written to {args.out}")


if __name__ == "__main__":
    main()
