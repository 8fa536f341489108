"""Real models on a real GPU: one stage of the 500m and 1.5b presets, bf16 against fp32, a 2-peer swarm.

1. Throughput: a middle stage (the preset's 6-stage split: 4 blocks) with m = 3 stashed microbatches of
   8 x the preset's context, forward all then backward all, under bf16 autocast and recomputation: tokens/s
   (median of --reps, min/max shown), model FLOPs utilisation against the device's peak dense bf16 FLOPs
   (table below, or --peak-tflops), and `max_memory_allocated`, recompute on and off.
2. bf16 against fp32: the small preset as one stage, --steps AdamW steps on the same batches from the same
   seed in each precision; the losses must agree within a few percent.
3. A 2-peer local swarm (coordinator + 2 peer processes, both on this GPU, 2 stages, small preset): median
   iteration time and tokens/s from the coordinator's metrics.

Runs in about 2-4 minutes on an H100/H200. Without CUDA it refuses in one line (exit 2).

    .venv/bin/python benchmarks/gpu.py [--presets 500m,1.5b] [--peak-tflops 989] [--skip-swarm]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sigterm import unwind_on_sigterm  # noqa: E402
from peers.model import FLAVORS, ModelConfig  # noqa: E402
from peers.optim import OptimConfig  # noqa: E402
from peers.precision import resolve_precision  # noqa: E402
from peers.stage import balanced_split  # noqa: E402
from peers.worker import StageWorker  # noqa: E402

PEAK_BF16_TFLOPS = {  # dense (no sparsity), bf16/fp16 with fp32 accumulation, vendor datasheets
    "H200": 989.0, "H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 756.0, "GH200": 989.0,
    "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L40": 181.0, "L4": 121.0, "A10G": 70.0, "A10": 125.0,
    "A6000": 155.0, "RTX 6000 Ada": 364.0, "4090": 165.0, "4080": 97.0, "3090": 71.0, "3080": 59.5,
    "V100": 125.0, "T4": 65.0,
}
"""Matched against torch.cuda.get_device_name, longest name first. V100 and T4: fp16 (they have no bf16)."""
GIB = 2.0 ** 30


def peak_tflops(name: str) -> float | None:
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key.lower() in name.lower():
            return PEAK_BF16_TFLOPS[key]
    return None


def stage_flops(cfg: ModelConfig, layers: int, batch: int, seq: int) -> float:
    """Model FLOPs of one microbatch's forward + backward through `layers` blocks (no recomputation counted):
    6 per parameter per token, plus causal attention's 6 * 2 * T * dim per token per layer (half of QK^T, AV)."""
    block = 4 * cfg.dim * cfg.dim + 3 * cfg.dim * cfg.ffn_dim
    tokens = batch * seq
    return layers * tokens * (6 * block + 6 * seq * cfg.dim)


def throughput(preset: str, precision: str, recompute: bool, batch: int, slots: int, reps: int) -> dict:
    cfg = FLAVORS[preset]
    split = balanced_split(cfg.n_layers, 6)
    w = StageWorker("gpu", 1, cfg, split, OptimConfig(fused=True), memory_slots=slots, device="cuda",
                    precision=precision, recompute=recompute)
    xs = [torch.randn(batch, cfg.max_seq_len, cfg.dim, device="cuda") for _ in range(slots)]
    gs = [torch.randn(batch, cfg.max_seq_len, cfg.dim, device="cuda") * 1e-3 for _ in range(slots)]

    def step() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for mb, x in enumerate(xs):
            w.forward(mb, x)
        for mb, g in enumerate(gs):
            w.backward(mb, g)
        w.step()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    step()  # warm-up: kernels chosen, AdamW moments allocated
    torch.cuda.reset_peak_memory_stats()
    times = [step() for _ in range(reps)]
    peak = torch.cuda.max_memory_allocated()
    tokens = slots * batch * cfg.max_seq_len
    return {"times": times, "tokens_per_s": tokens / statistics.median(times), "peak": peak,
            "flops": slots * stage_flops(cfg, split[1], batch, cfg.max_seq_len) / statistics.median(times)}


def loss_agreement(steps: int) -> list[tuple[float, float]]:
    cfg = FLAVORS["small"]
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, cfg.vocab_size, (8, cfg.max_seq_len + 1), generator=gen) for _ in range(steps)]
    losses = {}
    for precision in ("fp32", "bf16"):
        w = StageWorker(precision, 0, cfg, (cfg.n_layers,), OptimConfig(lr=3e-4), device="cuda",
                        precision=precision, seed=0)
        losses[precision] = []
        for tokens in batches:
            loss, g = w.loss(0, w.inject(0, tokens))
            w.backward(0, g)
            w.step()
            losses[precision].append(loss)
    return list(zip(losses["fp32"], losses["bf16"], strict=True))


def local_swarm(iterations: int) -> dict:
    from swarm.local.local_swarm import LocalSwarm

    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "run.toml"
        config.write_text('[run]\nmodel = "small"\nstages = 2\nskip = 0.0\nmicrobatches = 4\nmemory = 4\n'
                          f'iterations = {iterations}\nmin_peers = 2\n[data]\nseq_len = 512\nbatch_size = 8\n'
                          '[train]\nprecision = "auto"\n')
        run = LocalSwarm(Path(tmp) / "run", 2, run_id="gpu-bench", coordinator_args=["--config", str(config)],
                         peer_args=["--device", "cuda", "--threads", "4"])
        try:
            run.start()
            records = run.watch(iterations, timeout=240)
        finally:
            run.stop()
    steady = records[2:] or records
    return {"iterations": len(records),
            "iteration_seconds": statistics.median(r["iteration_seconds"] for r in steady),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady if r.get("tokens_per_s")),
            "loss": (records[0].get("loss"), records[-1].get("loss"))}


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="500m,1.5b")
    ap.add_argument("--batch", type=int, default=8, help="samples per microbatch")
    ap.add_argument("--slots", type=int, default=3, help="stashed microbatches m")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="steps of the bf16-vs-fp32 loss comparison")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's peak dense bf16 TFLOPs")
    ap.add_argument("--skip-swarm", action="store_true")
    ap.add_argument("--swarm-iterations", type=int, default=8)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA GPU and this machine has none (benchmarks/memory.py measures on CPU)",
              file=sys.stderr)
        return 2
    bad = [p for p in args.presets.split(",") if p not in FLAVORS]
    if bad:
        print(f"unknown preset(s): {', '.join(bad)}", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name()
    precision = resolve_precision("auto", "cuda")
    if precision == "fp32":
        precision = "fp16"  # no native bf16: the fp16 path (loss scale 1024) is what such a run would use
    peak = args.peak_tflops or peak_tflops(name)
    print(f"{name}, torch {torch.__version__}, {precision} autocast, fp32 master weights, fused AdamW; peak "
          f"{peak or '?'} TFLOPs{' (--peak-tflops to set it)' if peak is None else ''}\n")
    print("| preset | stage | microbatches | recompute | tokens/s (median) | step min/median/max | MFU | "
          "peak memory |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in args.presets.split(","):
        cfg = FLAVORS[preset]
        for recompute in (True, False):
            try:
                r = throughput(preset, precision, recompute, args.batch, args.slots, args.reps)
            except torch.cuda.OutOfMemoryError:
                r = None
            torch.cuda.empty_cache()  # the stage just measured is gone: start the next one from empty
            if r is None:
                print(f"| {preset} | middle (4 blocks) | {args.slots} x {args.batch} x {cfg.max_seq_len} | "
                      f"{'blocks' if recompute else 'none'} | out of memory | | | |")
                continue
            t = r["times"]
            mfu = f"{r['flops'] / (peak * 1e12):.1%}" if peak else "?"
            print(f"| {preset} | middle (4 blocks) | {args.slots} x {args.batch} x {cfg.max_seq_len} | "
                  f"{'blocks' if recompute else 'none'} | {r['tokens_per_s']:,.0f} | "
                  f"{min(t):.3f} / {statistics.median(t):.3f} / {max(t):.3f} s | {mfu} | {r['peak'] / GIB:.1f} GiB |",
                  flush=True)
    pairs = loss_agreement(args.steps)
    worst = max(abs(b - a) / a for a, b in pairs)
    print(f"\nsmall preset, {args.steps} steps, fp32 vs {precision} loss: "
          + ", ".join(f"{a:.4f}/{b:.4f}" for a, b in pairs) + f"; worst relative difference {worst:.2%}")
    if not args.skip_swarm:
        try:
            s = local_swarm(args.swarm_iterations)
            print(f"2-peer local swarm on this GPU (small, 2 stages, 4 x 8 x 512 per iteration): {s['iterations']} "
                  f"iterations, median {s['iteration_seconds']:.2f} s ({s['tokens_per_s']:,.0f} tokens/s), loss "
                  f"{s['loss'][0]} -> {s['loss'][1]}")
        except (RuntimeError, TimeoutError) as e:
            print(f"2-peer local swarm failed: {e}")
    return 0 if worst < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
