"""`skippipe import-hf` and `skippipe export-hf`: Hugging Face Llama directories <-> skippipe checkpoints.

The conversion is `peers.hf_llama`; these commands parse flags, call it, and turn every refusal into one
line and exit code 2.
"""

from __future__ import annotations

import re
from pathlib import Path

import click


class ConversionRefused(click.ClickException):
    """A directory that cannot be converted: one line on stderr, exit code 2 (as a usage error)."""

    exit_code = 2


def _size(text: str) -> int:
    """'5GB', '500MB', '64KB' or a plain byte count -> bytes (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)I?B?\s*", text.upper())
    if not m or int(m.group(1)) < 1:
        raise click.BadParameter(f"{text!r} is not a size like 5GB, 500MB or 65536", param_hint="--max-shard-size")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


@click.command("import-hf")
@click.argument("hf_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="New or empty checkpoint directory to write.")
@click.option("--stages", type=click.IntRange(1, 1024), default=3, show_default=True,
              help="Pipeline stages S to split the layers into (balanced).")
def import_hf_command(hf_dir: Path, output: Path, stages: int) -> None:
    """Turn a local Hugging Face Llama directory (config.json, safetensors, tokenizer.json) into a skippipe
    checkpoint of S stages, with a run.toml describing the model."""
    from peers.hf_llama import import_hf

    try:
        result = import_hf(hf_dir, output, stages)
    except (ValueError, OSError) as e:
        raise ConversionRefused(str(e)) from None
    cfg = result.config
    click.echo(f"imported {cfg.num_params() / 1e6:.1f}M parameters ({cfg.n_layers} layers, dim {cfg.dim}, "
               f"{cfg.n_heads} heads / {cfg.kv_heads} kv, {result.dtype}) as {len(result.split)} stages "
               f"{list(result.split)} into {result.step_dir}; model config in {result.run_toml}"
               + ("" if result.tokenizer else " (no tokenizer.json: `skippipe eval` needs one)"))


@click.command("export-hf")
@click.argument("checkpoint_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("more_dirs", nargs=-1, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="New or empty directory for the Hugging Face files.")
@click.option("--max-shard-size", "max_shard", default="5GB", show_default=True,
              help="Larger weights are written as numbered shards with an index.")
def export_hf_command(checkpoint_dir: Path, more_dirs: tuple[Path, ...], output: Path, max_shard: str) -> None:
    """Write a skippipe checkpoint as a Hugging Face LlamaForCausalLM directory that transformers loads.

    Given peers' --checkpoint-dir directories (several, or one directory holding them), gather them first, as
    `skippipe gather` does, into a temporary checkpoint beside the output."""
    import tempfile

    from peers.checkpoint_gather import holds_peer_checkpoint
    from peers.hf_llama import export_hf
    from swarm.cli.gather import gather_into

    limit = _size(max_shard)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConversionRefused(f"output directory {output} exists and is not empty")
    checkpoint_dirs, one = (checkpoint_dir, *more_dirs), checkpoint_dir
    gather = bool(more_dirs) or holds_peer_checkpoint(one) \
        or any(d.is_dir() and holds_peer_checkpoint(d) for d in one.iterdir())
    try:
        if gather:
            output.resolve().parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=".skippipe-gather-", dir=output.resolve().parent) as tmp:
                gather_into(checkpoint_dirs, Path(tmp) / "ckpt", None)
                result = export_hf(Path(tmp) / "ckpt", output, max_shard_bytes=limit)
        else:
            result = export_hf(one, output, max_shard_bytes=limit)
    except (ValueError, OSError) as e:
        raise ConversionRefused(str(e)) from None
    click.echo(f"exported {result.num_params / 1e6:.1f}M parameters to {output}: {', '.join(result.files)}")
