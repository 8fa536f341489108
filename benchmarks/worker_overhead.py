"""Stage-worker overhead against plain torch, and the memory one peer needs for each model preset.

1. Overhead: the worker's forward + backward of one microbatch (input checks, stash, gradient
   hand-off) against plain torch running the same layers with autograd, in the same process,
   alternating the two so both see the same machine load. Medians over --reps. Target: within 10%.
2. Peak memory per peer, for each preset split into --stages balanced stages: weights, gradients and
   AdamW moments (fp32, 16 bytes per parameter) plus `m` stashed microbatches of saved activations.
   Saved activations are measured, not guessed: one block runs on real tensors under a
   saved-tensor hook (B=1, T=128; they grow linearly with B*T with flash-style attention) and are
   scaled to --batch-size x the preset's context. Stage 0 adds its embedding, head and transient logits.

    .venv/bin/python benchmarks/worker_overhead.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from peers.model import FLAVORS, Block, ModelConfig, Transformer, lm_loss
from peers.optim import OptimConfig
from peers.stage import balanced_split, stage_layers
from peers.worker import StageWorker
from scheduler.constants import DEFAULT_MEMORY_SLOTS


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def overhead(cfg: ModelConfig, stages: int, batch: int, seq: int, reps: int) -> dict[str, float]:
    split = balanced_split(cfg.n_layers, stages)
    optim = OptimConfig()
    mid = StageWorker("mid", 1, cfg, split, optim)
    head = StageWorker("head", 0, cfg, split, optim)
    plain_mid = Transformer(cfg, layers=stage_layers(split, 1), with_embedding=False, with_head=False)
    plain_head = Transformer(cfg, layers=stage_layers(split, 0))
    x = torch.randn(batch, seq, cfg.dim)
    g = torch.randn(batch, seq, cfg.dim) * 1e-3
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1))
    back = head.inject(0, tokens)
    head.drop(0)

    def worker_mid() -> None:
        mid.forward(0, x)
        mid.backward(0, g)

    def torch_mid() -> None:
        xi = x.detach().requires_grad_(True)
        plain_mid.run_layers(xi).backward(g)
        _ = xi.grad

    def worker_head() -> None:
        h = head.inject(0, tokens)
        _, gh = head.loss(0, back)
        head.backward(0, gh)
        del h

    def torch_head() -> None:
        h = plain_head.run_layers(plain_head.embed(tokens[:, :-1]))
        xi = back.detach().requires_grad_(True)
        lm_loss(plain_head.logits(xi), tokens[:, 1:]).backward()
        h.backward(xi.grad)

    out = {}
    for name, (a, b) in {"middle stage": (worker_mid, torch_mid), "stage 0": (worker_head, torch_head)}.items():
        for _ in range(3):  # warm-up
            a(), b()
        wa, wb = [], []
        for _ in range(reps):
            wa.append(_timed(a))
            wb.append(_timed(b))
        out[name] = (statistics.median(wa), statistics.median(wb))
    return out


def saved_bytes_per_token(cfg: ModelConfig, tokens: int = 128) -> float:
    """Bytes autograd saves for one block, per token of a microbatch (parameters excluded)."""
    block = Block(cfg)
    params = {id(p) for p in block.parameters()}
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        base = t._base if t._base is not None else t
        if id(t) not in params and id(base) not in params:
            total += t.numel() * t.element_size()
        return t

    x = torch.randn(1, tokens, cfg.dim, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return total / tokens


def memory_table(stages: int, batch: int, slots: int) -> list[dict]:
    rows = []
    for name, cfg in FLAVORS.items():
        n_stages = min(stages, cfg.n_layers)
        split = balanced_split(cfg.n_layers, n_stages)
        tokens = batch * cfg.max_seq_len
        per_layer = saved_bytes_per_token(cfg) * tokens
        block_params = 4 * cfg.dim * cfg.dim + 3 * cfg.dim * cfg.ffn_dim + 2 * cfg.dim
        for stage in (0, 1):
            params = split[stage] * block_params + (2 * cfg.vocab_size * cfg.dim + cfg.dim if stage == 0 else 0)
            states = 16 * params
            acts = slots * split[stage] * per_layer + (slots * tokens * cfg.dim * 4 if stage == 0 else 0)
            logits = 3 * tokens * cfg.vocab_size * 4 if stage == 0 else 0  # logits, softmax, their gradient
            rows.append({"preset": name, "stages": n_stages, "stage": "0" if stage == 0 else "1..S-1",
                         "params_m": params / 1e6, "states_gib": states / 2**30, "acts_gib": acts / 2**30,
                         "peak_gib": (states + acts + logits) / 2**30, "tokens": tokens})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=sorted(FLAVORS))
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--memory-stages", type=int, default=6)
    ap.add_argument("--memory-slots", type=int, default=DEFAULT_MEMORY_SLOTS)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = FLAVORS[args.model]
    print(f"overhead: {args.model}, {args.stages} stages, microbatch {args.batch_size}x{args.seq_len}, "
          f"{torch.get_num_threads()} threads, median of {args.reps}")
    for name, (worker, plain) in overhead(cfg, args.stages, args.batch_size, args.seq_len, args.reps).items():
        print(f"  {name:>12}: worker {worker * 1e3:7.2f} ms, plain torch {plain * 1e3:7.2f} ms, "
              f"ratio {worker / plain:.3f}")
    print(f"\npeak memory per peer (fp32 AdamW, {args.memory_slots} stashed microbatches of {args.batch_size} x "
          f"context tokens, {args.memory_stages} balanced stages):")
    print(f"  {'preset':>6} {'stage':>8} {'params':>9} {'w+g+adam':>9} {'acts':>9} {'peak':>9}")
    for r in memory_table(args.memory_stages, args.batch_size, args.memory_slots):
        print(f"  {r['preset']:>6} {r['stage']:>8} {r['params_m']:8.1f}M {r['states_gib']:8.2f}G "
              f"{r['acts_gib']:8.2f}G {r['peak_gib']:8.2f}G")


if __name__ == "__main__":
    main()
