"""`skippipe swarm inprocess` (train a whole planned swarm in this process) and `skippipe eval`.

`swarm` is a click group so that other runtimes (the networked `local` launcher) add themselves
with `@swarm.command("local")` or `swarm.add_command(...)` without touching this file's commands.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import click

MODEL_FLAVORS = ("tiny", "small", "500m", "1.5b")


@click.group(name="swarm")
def swarm() -> None:
    """Run a whole swarm on this machine."""


@swarm.command("inprocess")
@click.option("--model", "flavor", type=click.Choice(MODEL_FLAVORS), default="tiny", show_default=True,
              help="Model preset.")
@click.option("--peers", "num_peers", type=click.IntRange(1, 512), default=6, show_default=True,
              help="Peers in the swarm (stage-0 peers are data holders).")
@click.option("--stages", "num_stages", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Pipeline stages S (at most the model's layers).")
@click.option("--skip", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.0, show_default=True,
              help="Skip ratio k = 1 - R/S (0: full pipeline; the paper: 0.33).")
@click.option("--iterations", type=click.IntRange(1, 10_000_000), default=100, show_default=True,
              help="Training iterations in total (a resumed run continues up to this).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds weights, planning and data order.")
@click.option("--metrics", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Append one JSON line per iteration to this file.")
@click.option("--checkpoint", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Checkpoint directory: resumed from when it holds one, written at every evaluation.")
@click.option("--profile", default="single-cluster", show_default=True,
              help="Network preset (or profile file) the planner places peers and plans paths on.")
@click.option("--data", "data_paths", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Local .txt/.jsonl training files (repeatable); default: the bundled corpus.")
@click.option("--microbatches", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="Microbatches per data holder per iteration.")
@click.option("--batch-size", type=click.IntRange(1, 4096), default=8, show_default=True,
              help="Samples per microbatch.")
@click.option("--seq-len", type=click.IntRange(2, 1 << 20), default=64, show_default=True, help="Tokens per sample.")
@click.option("--lr", type=click.FloatRange(0.0, 1.0, min_open=True), default=3e-3, show_default=True,
              help="Peak learning rate (warmup then cosine decay over --iterations).")
@click.option("--eval-every", type=click.IntRange(0, 1_000_000), default=10, show_default=True,
              help="Validate (and checkpoint) every N iterations and after the last; 0 = after the last only.")
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cpu or cuda.")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True,
              help="Autocast precision (bf16/fp16 for CUDA).")
@click.option("--init-from", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Start from this checkpoint's weights (e.g. import-hf's output), its model, stages and tokenizer; "
                   "optimizer fresh, iteration 0.")
def inprocess(flavor: str, num_peers: int, num_stages: int, skip: float, iterations: int, seed: int,
              metrics: Path | None, checkpoint: Path | None, profile: str, data_paths: tuple[str, ...],
              microbatches: int, batch_size: int, seq_len: int, lr: float, eval_every: int, device: str,
              precision: str, init_from: Path | None) -> None:
    """Plan a swarm with the scheduler and train it in this process (no network)."""
    import torch

    from peers.checkpoint import (
        CheckpointError,
        has_checkpoint,
        load_checkpoint,
        load_initial_weights,
        resolve_checkpoint,
    )
    from peers.data import Corpus, DataConfig
    from peers.inprocess import InProcessSwarm
    from peers.model import FLAVORS, ModelConfig
    from peers.optim import OptimConfig
    from peers.train import train_loop
    from scheduler.planner import plan_for_profile
    from scheduler.schedule import ScheduleError

    base, tokenizer = FLAVORS[flavor], None
    if init_from is not None:
        given = click.get_current_context().get_parameter_source
        if given("flavor") != click.core.ParameterSource.DEFAULT:
            raise click.BadParameter("--init-from's checkpoint has its own model: drop --model", param_hint="--model")
        try:
            init_dir, init_manifest = resolve_checkpoint(init_from)
            base = ModelConfig.from_dict(init_manifest["model"])
        except (TypeError, ValueError) as e:
            raise click.ClickException(f"--init-from {init_from}: {e}") from None
        stages = len(init_manifest["split"])
        if given("num_stages") != click.core.ParameterSource.DEFAULT and num_stages != stages:
            raise click.BadParameter(f"--init-from's checkpoint has {stages} stages", param_hint="--stages")
        num_stages, flavor = stages, init_from.name
        if "tokenizer.json" in init_manifest["files"]:
            tokenizer = str(init_dir / "tokenizer.json")
    if num_stages > base.n_layers:
        raise click.BadParameter(f"{flavor} has {base.n_layers} layers, so at most {base.n_layers} stages",
                                 param_hint="--stages")
    if seq_len > base.max_seq_len:
        raise click.BadParameter(f"{flavor} takes at most {base.max_seq_len} tokens", param_hint="--seq-len")
    if num_peers < num_stages:
        raise click.BadParameter(f"need at least one peer per stage ({num_stages})", param_hint="--peers")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise click.BadParameter("CUDA is not available on this machine", param_hint="--device")
    try:
        corpus = Corpus.build(DataConfig(paths=tuple(data_paths), tokenizer=tokenizer, seq_len=seq_len,
                                         batch_size=batch_size, seed=seed))
        cfg = dataclasses.replace(base, vocab_size=corpus.vocab_size) if init_from is None else base
        if corpus.vocab_size > cfg.vocab_size:
            raise ValueError(f"the tokenizer has {corpus.vocab_size} tokens, more than the model's vocab_size "
                             f"{cfg.vocab_size}")
        schedule = plan_for_profile(profile, num_peers=num_peers, num_stages=num_stages, skip=skip,
                                    microbatches_per_holder=microbatches, seed=seed, num_layers=cfg.n_layers)
        optim = OptimConfig(lr=lr, warmup_steps=max(1, iterations // 20), total_steps=iterations)
        resume = checkpoint is not None and has_checkpoint(checkpoint)
        if resume:
            step_dir, manifest = resolve_checkpoint(checkpoint)  # the manifest and the weights of the same save
            # an exact resume keeps the learning-rate schedule it was started with, whatever --iterations is now
            saved = OptimConfig.from_dict(manifest["optim"])
            if dataclasses.replace(saved, warmup_steps=optim.warmup_steps, total_steps=iterations) == optim:
                optim = saved
        trainer = InProcessSwarm(schedule, cfg, optim, corpus=corpus, device=device, precision=precision, seed=seed)
        if resume:
            load_checkpoint(step_dir, trainer)
            click.echo(f"resumed from {step_dir} at iteration {trainer.iteration} (learning rate decays over "
                       f"{optim.total_steps} steps)", err=True)
        elif init_from is not None:
            load_initial_weights(init_dir, trainer)
            click.echo(f"starting from the weights of {init_dir} (iteration 0, optimizer fresh)", err=True)
    except (ValueError, ScheduleError, CheckpointError) as e:
        raise click.ClickException(str(e)) from None

    visits = schedule.stage_visits()
    click.echo(f"{flavor}: {cfg.num_params() / 1e6:.1f}M parameters, split {list(trainer.split)}; "
               f"{num_peers} peers, placement {[len(schedule.stage_peers(s)) for s in range(num_stages)]}, "
               f"R={schedule.rules.stages_per_path} of S={num_stages} (skip {schedule.rules.skip_ratio:.2f}), "
               f"{len(schedule.routes)} microbatches/iteration, stage visits {dict(sorted(visits.items()))}",
               err=True)
    out = metrics.open("a") if metrics is not None else None
    interactive = sys.stderr.isatty()

    def show(record: dict) -> None:
        if out is not None:
            out.write(json.dumps(record) + "\n")
            out.flush()
        line = (f"iter {record['iteration']:>5}/{iterations}  loss {record['loss']:.4f}  "
                f"{record['tokens_per_s']:>9.0f} tok/s")
        if "val_loss" in record:
            line += f"  val_loss {record['val_loss']:.4f}  val_ppl {record['val_perplexity']:.2f}"
            click.echo(f"\r{line}", err=True)
        elif interactive:
            click.echo(f"\r{line}", nl=False, err=True)

    try:
        train_loop(trainer, iterations, eval_every=eval_every, checkpoint_dir=checkpoint, on_record=show)
    except (ValueError, FloatingPointError) as e:
        raise click.ClickException(str(e)) from None
    finally:
        if out is not None:
            out.close()


@click.command("eval")
@click.argument("checkpoint_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--omit", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True,
              help="Fraction of the non-zero stages to omit (a random sorted subset per batch).")
@click.option("--batches", type=click.IntRange(1, 1_000_000), default=None, help="Validation batches (default all).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the omitted subsets.")
@click.option("--json", "as_json", is_flag=True, help='Print {"perplexity": P, "perplexity_omitted": Q, ...}.')
def eval_command(checkpoint_dir: Path, omit: float, batches: int | None, seed: int, as_json: bool) -> None:
    """Validation perplexity of a checkpoint: the whole model, and with --omit of its stages left out."""
    from peers.checkpoint import CheckpointError, load_model, resolve_checkpoint
    from peers.data import Corpus, DataConfig
    from peers.evaluate import evaluate

    try:
        step_dir = resolve_checkpoint(checkpoint_dir)[0]  # the tokenizer of the same save as the weights
        model, manifest = load_model(step_dir)
        if not isinstance(manifest.get("data"), dict):
            raise CheckpointError(f"{checkpoint_dir} records no data config to take the validation split from")
        data = DataConfig.from_dict({**manifest["data"], "tokenizer": str(step_dir / "tokenizer.json")})
        corpus = Corpus.build(data)
        result = evaluate(model, corpus.validation_batches(batches), manifest["split"], omit=omit, seed=seed)
    except (ValueError, CheckpointError) as e:
        raise click.ClickException(str(e)) from None
    payload = {**result.to_dict(), "iteration": manifest["iteration"], "stages": len(manifest["split"])}
    if as_json:
        click.echo(json.dumps(payload))
        return
    click.echo(f"iteration {manifest['iteration']}: perplexity {result.perplexity:.3f} (loss {result.loss:.4f})")
    if result.perplexity_omitted is not None:
        change = result.perplexity_omitted / result.perplexity - 1
        click.echo(f"with {omit:.0%} of the {len(manifest['split']) - 1} non-zero stages omitted "
                   f"({result.kept_stages} kept): perplexity {result.perplexity_omitted:.3f} ({change:+.1%})")
