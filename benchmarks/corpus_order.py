"""Does the validation loss turn up because of the learning rate or because of the order of the corpus?

In the churn benchmark on the standard library's sources in path order (`benchmarks/churn.py --corpus stdlib`,
2026-12-04), every method's validation loss turned up after ~200 iterations. Two suspects: the default peak
learning rate (3e-3, nearly constant over such a window), or the data. In path order, the held-out modules that
validation reads first come from the first packages, the ones every shard also reads first; later the shards move
on to other packages and the model to other code.

This trains the tiny model in-process (no network: the data path is the swarm's, the timing is not) on the full
pipeline of 8 peers and 3 stages, 2 microbatches per holder, for `--iterations`, once per (order, learning rate),
and prints the validation loss every `--eval-every` iterations, with the iteration of its minimum and how far it
rose after it.

    .venv/bin/python benchmarks/corpus_order.py [--orders shuffled,path] [--lrs 3e-3,1e-3] [--iterations 300]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.stdlib_corpus import ORDER_SEED, write_stdlib_corpus  # noqa: E402
from peers.data import Corpus, DataConfig  # noqa: E402
from peers.inprocess import InProcessSwarm, simple_schedule  # noqa: E402
from peers.model import FLAVORS  # noqa: E402
from peers.optim import OptimConfig  # noqa: E402
from peers.train import train_loop  # noqa: E402

ORDERS = {"shuffled": ORDER_SEED, "path": None}


def curve(corpus: Corpus, lr: float, iterations: int, eval_every: int) -> list[tuple[int, float]]:
    """(iteration, validation loss) of one training run; the optimizer as the churn benchmark's runs configure it
    (no iteration count: warmup of 2 steps, cosine over 1000)."""
    model = dataclasses.replace(FLAVORS["tiny"], vocab_size=corpus.vocab_size)
    schedule = simple_schedule(8, 3, 0.0, microbatches_per_holder=2)
    swarm = InProcessSwarm(schedule, model, OptimConfig(lr=lr, warmup_steps=2, total_steps=1000), corpus=corpus)
    records = train_loop(swarm, iterations, eval_every=eval_every, eval_batches=16)
    return [(r["iteration"], round(r["val_loss"], 3)) for r in records if "val_loss" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", default=",".join(ORDERS))
    parser.add_argument("--lrs", default="3e-3,1e-3")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    orders = [o for o in args.orders.split(",") if o]
    try:
        lrs = [float(x) for x in args.lrs.split(",") if x]
    except ValueError:
        sys.exit(f"error: --lrs must be comma-separated numbers, got {args.lrs!r}")
    if set(orders) - set(ORDERS) or not orders or not lrs or min(lrs) <= 0 or args.iterations < args.eval_every:
        sys.exit(f"error: --orders among {', '.join(ORDERS)}, positive --lrs, --iterations >= --eval-every")
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for order in orders:
            path = Path(tmp) / f"stdlib-{order}.jsonl"
            write_stdlib_corpus(path, order_seed=ORDERS[order])
            corpus = Corpus.build(DataConfig(paths=(str(path),)))
            for lr in lrs:
                start = time.monotonic()
                points = curve(corpus, lr, args.iterations, args.eval_every)
                best = min(points, key=lambda p: p[1])
                rise = round(max(loss for it, loss in points if it >= best[0]) - best[1], 3)
                final = points[-1][1]
                results.append({"order": order, "lr": lr, "curve": points, "best": best, "final": final,
                                "rise_after_best": rise, "seconds": round(time.monotonic() - start)})
                print(f"{order:>8} lr {lr:g}: best {best[1]:.3f} at iteration {best[0]}, final {final:.3f}, "
                      f"rose {rise:.3f} after its best; {' '.join(f'{it}:{v:.2f}' for it, v in points)}",
                      flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": vars(args),
                                              "results": results}, indent=1))


if __name__ == "__main__":
    main()
