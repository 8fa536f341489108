"""Measured peak memory of one stage's step, with and without activation recomputation, and its time cost.

One worker of the stage (first: embedding, blocks, head and loss; middle: blocks only) does what a peer does
with m stashed microbatches: forward all m, then (loss and) backward all m, then one AdamW step. Memory is
measured, not estimated: `torch.cuda.max_memory_allocated` on CUDA, on CPU `peers.memory_meter.LiveTensorMemory`
(every tensor storage the step allocates, counted until it is freed) plus the weights and AdamW moments that
exist before the step (their real storages). Time: --reps steps each way (min/median/max), alternating.

The presets' full sizes (1.5b: 8 x 4096 tokens per microbatch) do not run on a small CPU. --seq-len and
--batch scale a microbatch down; with two or more --seq-len values each row's activation memory (peak minus
weights and moments) is fitted linearly in tokens per microbatch, the fit's worst error on the measured points
is shown, and the preset's full microbatch (--target-batch x its context) is extrapolated from it, labelled.

    .venv/bin/python benchmarks/memory.py --presets tiny,small --seq-len 128,256
    .venv/bin/python benchmarks/memory.py --device cuda   # full sizes on a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import torch

from peers.memory_meter import LiveTensorMemory
from peers.model import FLAVORS
from peers.optim import OptimConfig
from peers.stage import balanced_split
from peers.worker import StageWorker

GIB = 2.0 ** 30
KINDS = {"first": 0, "middle": 1}


def storage_bytes(tensors: Iterator[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def resident_bytes(w: StageWorker) -> int:
    """Weights and AdamW moments (what lives between steps), from their real storages."""
    state = (v for s in w.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim())
    return storage_bytes(iter([*w.module.parameters(), *state]))


def prime_optimizer(w: StageWorker) -> None:
    """Create AdamW's moments (as after the first step) without a full step."""
    for p in w.module.parameters():
        p.grad = torch.zeros_like(p)
    w.optimizer.step()
    w.optimizer.zero_grad(set_to_none=True)


def one_step(w: StageWorker, inputs: list[torch.Tensor], grads: list[torch.Tensor],
             stashed: Callable[[], None] = lambda: None) -> None:
    """Forward all microbatches (stashed), then the loss and backward of each, then one optimizer step;
    `stashed` is called when all m are stashed."""
    if w.stage == 0:
        outs = [w.inject(mb, tokens) for mb, tokens in enumerate(inputs)]
        stashed()
        for mb, h in enumerate(outs):
            _, g = w.loss(mb, h)
            w.backward(mb, g)
    else:
        for mb, x in enumerate(inputs):
            w.forward(mb, x)
        stashed()
        for mb, g in enumerate(grads):
            w.backward(mb, g)
    w.step()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(preset: str, kind: str, batch: int, seq: int, slots: int, stages: int, device: torch.device,
            precision: str, reps: int) -> list[dict]:
    """Peak memory and step times of one stage, recompute off and on."""
    cfg = FLAVORS[preset]
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, seq))
    split, stage = balanced_split(cfg.n_layers, stages), KINDS[kind]
    gen = torch.Generator().manual_seed(0)
    if stage == 0:
        inputs = [torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=gen) for _ in range(slots)]
    else:
        inputs = [torch.randn(batch, seq, cfg.dim, generator=gen).to(device) for _ in range(slots)]
    grads = [(torch.randn(batch, seq, cfg.dim, generator=gen) * 1e-3).to(device) for _ in range(slots)]
    def worker(rc: bool) -> StageWorker:
        return StageWorker(kind, stage, cfg, split, OptimConfig(), memory_slots=slots, device=device,
                           precision=precision, recompute=rc)

    # memory only: one worker at a time (the large presets' stages are gigabytes each)
    workers = {rc: worker(rc) for rc in (False, True)} if reps else {}
    rows = []
    for rc in (False, True):
        w = workers[rc] if reps else worker(rc)
        prime_optimizer(w)
        resident = resident_bytes(w)
        if device.type == "cuda":
            sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            held: list[int] = []
            one_step(w, inputs, grads, lambda h=held, b=before: h.append(torch.cuda.memory_allocated(device) - b))
            sync(device)
            peak = torch.cuda.max_memory_allocated(device)
        else:
            with LiveTensorMemory() as meter:
                held = []
                one_step(w, inputs, grads, lambda h=held, m=meter: h.append(m.live))
            peak = resident + meter.peak
        rows.append({"preset": preset, "stage": kind, "recompute": rc, "batch": batch, "seq_len": seq,
                     "slots": slots, "layers": split[stage], "device": str(device), "precision": precision,
                     "resident_bytes": resident, "peak_bytes": peak, "activation_bytes": peak - resident,
                     "stash_bytes": held[0],
                     "times": []})
    for _ in range(reps):  # alternate, so both see the same machine load
        for row, w in zip(rows, workers.values(), strict=True):
            sync(device)
            start = time.perf_counter()
            one_step(w, inputs, grads)
            sync(device)
            row["times"].append(time.perf_counter() - start)
    return rows


def fit(points: list[tuple[int, int]]) -> tuple[float, float, float]:
    """Least-squares line bytes = a + b * tokens; also the worst relative error on the points."""
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(b for _, b in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    slope = sum((t - mx) * (b - my) for t, b in points) / var
    icpt = my - slope * mx
    worst = max(abs(icpt + slope * t - b) / b for t, b in points)
    return icpt, slope, worst


def report(rows: list[dict], target_batch: int) -> str:
    lines = ["| preset | stage | layers | microbatch (B x T) | recompute | weights+Adam | peak | activations | "
             "m stashed | step time min/median/max | recompute cost |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {(r["preset"], r["stage"], r["batch"], r["seq_len"]): r for r in rows if not r["recompute"]}
    for r in rows:
        t = r["times"]
        times = f"{min(t):.3f} / {statistics.median(t):.3f} / {max(t):.3f} s" if t else "-"
        cost = "-"
        b = base[(r["preset"], r["stage"], r["batch"], r["seq_len"])]
        if r["recompute"] and t and b["times"]:
            cost = f"{statistics.median(t) / statistics.median(b['times']):.2f}x"
        lines.append(f"| {r['preset']} | {r['stage']} | {r['layers']} | {r['batch']} x {r['seq_len']} | "
                     f"{'blocks' if r['recompute'] else 'none'} | {r['resident_bytes'] / GIB:.3f} GiB | "
                     f"{r['peak_bytes'] / GIB:.3f} GiB | {r['activation_bytes'] / GIB:.3f} GiB | "
                     f"{r['stash_bytes'] / GIB:.3f} GiB | {times} | {cost} |")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["preset"], r["stage"], r["recompute"]), []).append(r)
    extrapolated = [g for g in groups.values() if len({r["batch"] * r["seq_len"] for r in g}) >= 2]
    if extrapolated:
        lines += ["", f"Extrapolated to {target_batch} x the preset's context: the m stashed microbatches, fitted "
                  "linearly in tokens per microbatch on the measured rows above; weights+Adam + that stash is a lower "
                  "bound of the peak (gradients and the backward's transients come on top):", "",
                  "| preset | stage | recompute | fitted on tokens | fit's worst error | stash / 1k tokens | "
                  "weights+Adam + stash |", "|---|---|---|---|---|---|---|"]
        for g in extrapolated:
            r0 = g[0]
            points = sorted((r["batch"] * r["seq_len"], r["stash_bytes"]) for r in g)
            icpt, slope, worst = fit(points)
            tokens = target_batch * FLAVORS[r0["preset"]].max_seq_len
            peak = r0["resident_bytes"] + icpt + slope * tokens
            lines.append(f"| {r0['preset']} (ctx {FLAVORS[r0['preset']].max_seq_len}) | {r0['stage']} | "
                         f"{'blocks' if r0['recompute'] else 'none'} | {', '.join(str(p[0]) for p in points)} | "
                         f"{worst:.1%} | {slope * 1000 / GIB:.4f} GiB | {peak / GIB:.2f} GiB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="tiny,small,500m,1.5b")
    ap.add_argument("--stage-kinds", default="first,middle")
    ap.add_argument("--seq-len", default="", help="comma-separated contexts (default: each preset's own)")
    ap.add_argument("--batch", type=int, default=8, help="samples per microbatch")
    ap.add_argument("--target-batch", type=int, default=8, help="samples per microbatch to extrapolate to")
    ap.add_argument("--slots", type=int, default=3, help="stashed microbatches m")
    ap.add_argument("--stages", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3, help="timed steps each way (0: memory only)")
    ap.add_argument("--time-presets", default="", help="time only these presets (default: all)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    kinds = [k for k in args.stage_kinds.split(",") if k]
    bad = [p for p in presets if p not in FLAVORS] + [k for k in kinds if k not in KINDS]
    if bad:
        print(f"unknown preset or stage kind: {', '.join(bad)}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda, but CUDA is not available here", file=sys.stderr)
        return 2
    timed = set(args.time_presets.split(",")) if args.time_presets else set(presets)
    rows = []
    for preset in presets:
        seqs = [int(s) for s in args.seq_len.split(",") if s] or [FLAVORS[preset].max_seq_len]
        for kind in kinds:
            for seq in seqs:
                rows += measure(preset, kind, args.batch, seq, args.slots, args.stages, device, args.precision,
                                args.reps if preset in timed else 0)
                print(f"measured {preset} {kind} {args.batch}x{seq}", file=sys.stderr, flush=True)
    print(f"device {device}, {args.precision}, m = {args.slots} stashed microbatches, {args.stages} balanced stages, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(report(rows, args.target_batch))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
