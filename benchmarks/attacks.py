"""Hostile stage averaging in the in-process swarm: the plain mean against the robust one (issue #17).

The tiny model on 6 peers, 2 stages of 3 (3 data holders; stage 1 served by 3 peers, one of them faulty from the
first iteration). The faulty peer computes its gradients honestly and then sends, in turn:
- scaled: -1e6 x its gradient sum (the mean climbs the loss);
- huge: its gradient sum with one coordinate set to 3e38, finite (the mean's norm overflows: every member skips);
- weight: its own sum, claiming 2^40 visits (the mean is scaled by ~1e-12);
- and, beyond the issue's three, -10 x its sum: small enough to pass the history check, so CenteredClip alone
  has to bound it.
Each is trained --iterations iterations with the plain visit-weighted mean (the code before issue #17: claims
trusted, no history) and with the default robust mean (`peers.averaging.stage_mean`: weights bounded by the
schedule's visits, refusal of gradients far outside the stage's history, CenteredClip). Reported: the final
validation loss against an honest run with the plain mean, of the same seed and in the same invocation (ratio - 1;
target for the robust mean within 5%), over --repeats seeds (min / median / max); and what the robust mean costs
when nobody attacks: seconds per iteration against the plain mean's, and the averaging time itself.

    .venv/bin/python benchmarks/attacks.py    # ~6 min on 2 idle CPU cores
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import statistics
import time
from collections.abc import Callable
from unittest import mock

import torch

from peers.averaging import flat_sums, history_norm, install, stage_mean, visit_bounds
from peers.data import Corpus, DataConfig
from peers.inprocess import InProcessSwarm, simple_schedule
from peers.model import FLAVORS
from peers.optim import OptimConfig
from peers.train import train_loop, validation_loss
from peers.worker import StageWorker
from scheduler.schedule import Schedule

Fault = Callable[[torch.Tensor, int], tuple[torch.Tensor, int]]


def _huge(s: torch.Tensor, v: int) -> tuple[torch.Tensor, int]:
    s = s.clone()
    s[0] = 3e38
    return s, v


ATTACKS: dict[str, Fault] = {
    "none": lambda s, v: (s, v),
    "scaled -1e6x": lambda s, v: (s * -1e6, v),
    "huge 3e38": _huge,
    "weight 2^40": lambda s, v: (s, 2 ** 40),
    "scaled -10x": lambda s, v: (s * -10.0, v),
}
METHODS = ("plain mean", "robust")


class Averaging:
    """Stands in for `peers.inprocess.average_stage` (the in-process swarm's only averaging seam): the faulty peer's
    contribution is replaced by the attack's before the stage group combines it, with the plain or robust mean."""

    def __init__(self, schedule: Schedule, method: str, fault: Fault, faulty: str) -> None:
        self.scheduled, self.method, self.fault, self.faulty = schedule.visits(), method, fault, faulty
        self.calls = schedule.num_stages
        self.seconds: list[float] = []
        """Averaging time of each stage group, in call order (one call per stage per iteration)."""
        self.flagged = 0
        """Rounds in which some member was refused, cut down or clipped."""

    def per_iteration(self) -> list[float]:
        n = self.calls
        return [sum(self.seconds[i:i + n]) for i in range(0, len(self.seconds) - n + 1, n)] or [0.0]

    def __call__(self, workers: list[StageWorker]) -> int:
        ordered = sorted(workers, key=lambda w: w.peer_id)
        ids = [w.peer_id for w in ordered]
        sums, visits = [flat_sums(w) for w in ordered], [w.visits for w in ordered]
        if self.faulty in ids:
            i = ids.index(self.faulty)
            sums[i], visits[i] = self.fault(sums[i], visits[i])
        start = time.perf_counter()
        if self.method == "plain mean":
            result = stage_mean(sums, visits, aggregation="mean")
        else:
            bounds = visit_bounds(self.scheduled, ids, ids)
            result = stage_mean(sums, visits, bounds=[bounds[p] for p in ids], reference=history_norm(ordered[0]))
        self.seconds.append(time.perf_counter() - start)
        self.flagged += bool(result.refused)
        for w in ordered:
            install(w, result.mean, result.visits)
        return result.visits


def run(args: argparse.Namespace, corpus: Corpus, seed: int, attack: str, method: str) -> dict:
    cfg = dataclasses.replace(FLAVORS["tiny"], vocab_size=corpus.vocab_size)
    schedule = simple_schedule(6, 2, 0.0, microbatches_per_holder=args.microbatches, seed=seed)
    faulty = schedule.stage_peers(1)[-1]
    optim = OptimConfig(lr=args.lr, warmup_steps=max(1, args.iterations // 20), total_steps=args.iterations)
    torch.manual_seed(seed)
    swarm = InProcessSwarm(schedule, cfg, optim, corpus=corpus, seed=seed)
    averaging = Averaging(schedule, method, ATTACKS[attack], faulty)
    watched = swarm.workers[schedule.stage_peers(1)[0]].module  # an honest stage-1 peer
    start = torch.cat([p.detach().reshape(-1).clone() for p in watched.parameters()])
    diverged = None
    with mock.patch("peers.inprocess.average_stage", averaging):
        try:
            records = train_loop(swarm, args.iterations, eval_every=0, eval_batches=args.eval_batches)
        except FloatingPointError:
            diverged, records = swarm.iteration, []
    val = validation_loss(swarm, args.eval_batches)["loss"] if diverged is None else math.inf
    seconds = [r["seconds"] for r in records[len(records) // 10:]]  # past the first iterations' warm-up
    moved = float((torch.cat([p.detach().reshape(-1) for p in watched.parameters()]) - start).norm() / start.norm())
    return {"val_loss": val if math.isfinite(val) else math.inf, "diverged_at": diverged, "stage1_moved": moved,
            "iteration_s": statistics.median(seconds) if seconds else None,
            "averaging_ms": 1e3 * statistics.median(averaging.per_iteration()),
            "averaging_mean_ms": 1e3 * statistics.mean(averaging.per_iteration()), "flagged_rounds": averaging.flagged}


def spread(values: list[float]) -> str:
    if any(not math.isfinite(v) for v in values):
        return f"diverged in {sum(not math.isfinite(v) for v in values)} of {len(values)}"
    return f"{min(values):+.1%} / {statistics.median(values):+.1%} / {max(values):+.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3, help="seeds per (attack, method)")
    ap.add_argument("--microbatches", type=int, default=1, help="per data holder per iteration")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--attacks", nargs="*", default=list(ATTACKS), choices=list(ATTACKS))
    args = ap.parse_args()
    logging.getLogger("peers.worker").setLevel(logging.ERROR)  # the plain mean's skipped steps, every iteration

    corpus = Corpus.build(DataConfig(seq_len=args.seq_len, batch_size=args.batch_size, seed=0))
    print(f"tiny model, 6 peers (2 stages of 3, one faulty stage-1 peer), {args.iterations} iterations, "
          f"{args.repeats} seeds, microbatches {args.batch_size}x{args.seq_len}", flush=True)
    results: dict[str, dict[str, list[dict]]] = {a: {m: [] for m in METHODS} for a in args.attacks}
    run(argparse.Namespace(**{**vars(args), "iterations": 3}), corpus, 0, "none", "plain mean")  # warm-up
    began = time.perf_counter()
    for seed in range(args.repeats):
        for attack in args.attacks:
            for method in METHODS:  # alternated, so both see the same machine load
                r = run(args, corpus, seed, attack, method)
                results[attack][method].append(r)
                print(f"  seed {seed} {attack:>13} {method:>10}: val loss {r['val_loss']:.4f}"
                      + (f" (diverged at iteration {r['diverged_at']})" if r["diverged_at"] is not None else "")
                      + (f", {r['iteration_s'] * 1e3:.0f} ms/iteration" if r["iteration_s"] else "")
                      + f", averaging {r['averaging_ms']:.2f} ms/iteration, stage 1 moved {r['stage1_moved']:.4f}, "
                      f"{r['flagged_rounds']} rounds flagged", flush=True)
    baseline = [r["val_loss"] for r in results["none"]["plain mean"]] if "none" in results else None
    print(f"\nfinal validation loss against the honest plain-mean run of the same seed (min / median / max over "
          f"{args.repeats}); {time.perf_counter() - began:.0f} s in all")
    print("| attack | plain mean | robust |\n|---|---|---|")
    for attack, by_method in results.items():
        if baseline is None:
            break
        cells = [spread([r["val_loss"] / b - 1 for r, b in zip(by_method[m], baseline, strict=True)])
                 for m in METHODS]
        print(f"| {attack} | {cells[0]} | {cells[1]} |")
    print("\nhow far an honest stage-1 peer's weights moved (relative L2, median), plain mean | robust:")
    for attack, by_method in results.items():
        moved = [statistics.median(r["stage1_moved"] for r in by_method[m]) for m in METHODS]
        print(f"  {attack:>13}: {moved[0]:.4f} | {moved[1]:.4f}")
    if "none" in results:
        plain, robust = results["none"]["plain mean"], results["none"]["robust"]
        ratios = [r["iteration_s"] / p["iteration_s"] - 1 for r, p in zip(robust, plain, strict=True)]
        print(f"\nno attack, robust against plain: seconds per iteration {spread(ratios)} (min / median / max); "
              f"averaging {statistics.median(r['averaging_ms'] for r in robust):.2f} ms against "
              f"{statistics.median(p['averaging_ms'] for p in plain):.2f} ms per iteration (median; mean "
              f"{statistics.median(r['averaging_mean_ms'] for r in robust):.2f} against "
              f"{statistics.median(p['averaging_mean_ms'] for p in plain):.2f}), of "
              f"{statistics.median(p['iteration_s'] for p in plain) * 1e3:.0f} ms; honest rounds where CenteredClip "
              f"clipped someone: {[r['flagged_rounds'] for r in robust]} of {2 * args.iterations}")
    print(json.dumps({"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
