"""Checkpoints: per-stage weights and optimizer state in safetensors, everything else in JSON. No pickle.

A checkpoint directory holds

- `checkpoint.json`: format version, the resolved model / optimizer / data config, the layer split,
  iteration and optimizer step, each data holder's shard position, and the SHA-256 of every file;
- `stage-{s}.safetensors` (weights, full-model parameter names) and `stage-{s}-optimizer.safetensors`
  (AdamW moments and step counts, keyed `{param}.exp_avg` ...) for every stage;
- `rng.safetensors` (torch's CPU generator) and `tokenizer.json` when trained on a corpus.

The manifest is written last, so an interrupted save is never mistaken for a complete one, and a
file whose hash differs from the manifest's is refused. Loading into a swarm whose model, split or
optimizer differs is refused with the first differing field named.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from peers.model import ModelConfig, Transformer
from peers.optim import OptimConfig
from peers.worker import StageWorker

CHECKPOINT_FORMAT = 1
MANIFEST = "checkpoint.json"
PEER_MANIFEST = "peer.json"
"""Manifest of one peer's own checkpoint of its stage."""
MAX_MANIFEST_BYTES = 16 << 20
_MOMENTS = ("exp_avg", "exp_avg_sq", "step")


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupted, or does not fit the model it is loaded into."""


# ---- one stage -------------------------------------------------------------------------------
def stage_tensors(worker: StageWorker) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(weights, optimizer tensors) of one worker, named by full-model parameter names."""
    weights = {k: v.detach().contiguous().cpu() for k, v in worker.module.state_dict().items()}
    optim: dict[str, torch.Tensor] = {}
    for name, p in worker.module.named_parameters():
        state = worker.optimizer.state.get(p, {})
        for key in _MOMENTS:
            if key in state:
                t = state[key] if isinstance(state[key], torch.Tensor) else torch.tensor(float(state[key]))
                optim[f"{name}.{key}"] = t.detach().reshape(-1 if t.dim() == 0 else t.shape).contiguous().cpu()
    return weights, optim


def load_stage_tensors(worker: StageWorker, weights: dict[str, torch.Tensor], optim: dict[str, torch.Tensor],
                       steps: int) -> None:
    """Restore one worker from `stage_tensors` output; raises CheckpointError on any mismatch."""
    expected = set(worker.module.state_dict())
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise CheckpointError(f"stage {worker.stage} weights do not match the model: missing {missing[:3]}, "
                              f"unexpected {extra[:3]}")
    try:
        worker.module.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"stage {worker.stage} weights do not fit the model: {e}") from None
    worker.optimizer.state.clear()
    for name, p in worker.module.named_parameters():
        present = [k for k in _MOMENTS if f"{name}.{k}" in optim]
        if not present:
            continue
        if len(present) != len(_MOMENTS):
            raise CheckpointError(f"optimizer state of {name} is incomplete")
        state = {}
        for key in ("exp_avg", "exp_avg_sq"):
            t = optim[f"{name}.{key}"]
            if t.shape != p.shape:
                raise CheckpointError(f"optimizer {name}.{key} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
            state[key] = t.to(p.device, p.dtype).clone()
        state["step"] = optim[f"{name}.step"].reshape(()).to(torch.float32).clone()
        worker.optimizer.state[p] = state
    worker.steps = steps
    worker.visits = 0


# ---- a whole in-process swarm ----------------------------------------------------------------
def save_checkpoint(path: str | os.PathLike, swarm: Any) -> Path:
    """Write `swarm` (an InProcessSwarm) to directory `path`; returns the manifest's path."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}

    def write_tensors(name: str, tensors: dict[str, torch.Tensor]) -> None:
        tmp = out / f".{name}.tmp"
        save_file(tensors, str(tmp), metadata={"format": str(CHECKPOINT_FORMAT)})
        os.replace(tmp, out / name)
        files[name] = _sha256(out / name)

    steps = {w.steps for w in swarm.workers.values()}
    if len(steps) != 1:
        raise CheckpointError(f"workers disagree on the optimizer step ({sorted(steps)}); save between iterations")
    for s in range(swarm.schedule.num_stages):
        worker = swarm.stage_workers(s)[0]  # peers of a stage hold equal weights and moments
        weights, optim = stage_tensors(worker)
        write_tensors(f"stage-{s}.safetensors", weights)
        write_tensors(f"stage-{s}-optimizer.safetensors", optim)
    write_tensors("rng.safetensors", {"torch_cpu": torch.get_rng_state()})
    data = None
    if swarm.corpus is not None:
        (out / "tokenizer.json").write_text(swarm.corpus.tokenizer.to_str())
        files["tokenizer.json"] = _sha256(out / "tokenizer.json")
        data = swarm.corpus.config.to_dict()
        data["paths"] = [str(Path(p).resolve()) for p in data["paths"]]
    first = next(iter(swarm.workers.values()))
    manifest = {
        "format": CHECKPOINT_FORMAT,
        "iteration": swarm.iteration,
        "steps": steps.pop(),
        "seed": swarm.seed,
        "dtype": str(first.dtype).removeprefix("torch."),
        "model": swarm.model_config.to_dict(),
        "optim": swarm.optim_config.to_dict(),
        "split": list(swarm.split),
        "data": data,
        "shards": {peer: shard.state_dict() for peer, shard in swarm.shards.items()},
        "schedule": swarm.schedule.to_dict(),
        "files": files,
    }
    tmp = out / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / MANIFEST)
    return out / MANIFEST


def save_stage_checkpoint(path: str | os.PathLike, worker: StageWorker, *, iteration: int, seed: int,
                          shard: Any = None, extra: dict[str, Any] | None = None) -> Path:
    """One peer's own checkpoint (its stage's weights and optimizer, its data position), in the same layout as
    `save_checkpoint` for that stage, so stage files from several peers can be gathered into a whole one."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    weights, optim = stage_tensors(worker)
    files = {}
    for name, tensors in ((f"stage-{worker.stage}.safetensors", weights),
                          (f"stage-{worker.stage}-optimizer.safetensors", optim)):
        tmp = out / f".{name}.tmp"
        save_file(tensors, str(tmp), metadata={"format": str(CHECKPOINT_FORMAT)})
        os.replace(tmp, out / name)
        files[name] = _sha256(out / name)
    manifest = {
        "format": CHECKPOINT_FORMAT, "stage": worker.stage, "iteration": iteration, "steps": worker.steps,
        "seed": seed, "model": worker.config.to_dict(), "optim": worker.optim_config.to_dict(),
        "split": list(worker.split), "shard": shard.state_dict() if shard is not None else None,
        "files": files, **(extra or {}),
    }
    tmp = out / f".{PEER_MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / PEER_MANIFEST)
    return out / PEER_MANIFEST


def read_manifest(path: str | os.PathLike, name: str = MANIFEST,
                  fields: tuple[tuple[str, type], ...] = ()) -> dict[str, Any]:
    """The checked manifest of checkpoint directory `path`: format, fields, every file's hash.

    :param name: the manifest file (`checkpoint.json` for a whole model, `peer.json` for one peer's stage)
    :param fields: the fields it must have (default: those of a whole-model checkpoint)
    """
    root = Path(path)
    mf = root / name
    if not mf.is_file():
        raise CheckpointError(f"{root} is not a checkpoint directory (no {name})")
    if mf.stat().st_size > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{mf} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{mf} is corrupted: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else "?"
        raise CheckpointError(f"{mf}: checkpoint format {found} is not supported (this build reads format "
                              f"{CHECKPOINT_FORMAT})")
    for key, kind in fields or (("iteration", int), ("steps", int), ("seed", int), ("model", dict), ("optim", dict),
                                ("split", list), ("shards", dict), ("files", dict)):
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            raise CheckpointError(f"{mf}: field {key!r} is missing or not a {kind.__name__}")
    for name, digest in manifest["files"].items():
        if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
            raise CheckpointError(f"{mf}: bad file name {name!r}")
        f = root / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint file {f} is missing")
        if _sha256(f) != digest:
            raise CheckpointError(f"checkpoint file {f} is corrupted (SHA-256 differs from the manifest)")
    return manifest


def _load_tensors(root: Path, name: str, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    if name not in manifest["files"]:
        raise CheckpointError(f"checkpoint {root} has no {name}")
    try:
        return load_file(str(root / name))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"checkpoint file {root / name} could not be read: {e}") from None


def load_checkpoint(path: str | os.PathLike, swarm: Any) -> dict[str, Any]:
    """Restore `swarm` (weights, optimizer, step, data positions, RNG) for an exact resume; returns the manifest."""
    root = Path(path)
    manifest = read_manifest(root)
    _expect_equal("model", manifest["model"], swarm.model_config.to_dict())
    _expect_equal("optim", manifest["optim"], swarm.optim_config.to_dict())
    _expect_equal("split", manifest["split"], list(swarm.split))
    _expect_equal("seed", manifest["seed"], swarm.seed)
    if set(manifest["shards"]) != set(swarm.shards):
        raise CheckpointError(f"checkpoint has data positions for {sorted(manifest['shards'])}, this swarm's data "
                              f"holders are {sorted(swarm.shards)}")
    if swarm.corpus is not None and manifest.get("data") is not None:
        mine = swarm.corpus.config.to_dict()
        mine["paths"] = [str(Path(p).resolve()) for p in mine["paths"]]
        theirs = {k: v for k, v in manifest["data"].items() if k != "tokenizer"}
        _expect_equal("data", theirs, {k: v for k, v in mine.items() if k != "tokenizer"})
    stages = [(_load_tensors(root, f"stage-{s}.safetensors", manifest),
               _load_tensors(root, f"stage-{s}-optimizer.safetensors", manifest))
              for s in range(swarm.schedule.num_stages)]
    for worker in swarm.workers.values():
        load_stage_tensors(worker, *stages[worker.stage], steps=manifest["steps"])
    for peer, shard in swarm.shards.items():
        try:
            shard.load_state_dict(manifest["shards"][peer])
        except ValueError as e:
            raise CheckpointError(f"data position of {peer}: {e}") from None
    rng = _load_tensors(root, "rng.safetensors", manifest).get("torch_cpu")
    if rng is not None:
        torch.set_rng_state(rng)
    swarm.iteration = manifest["iteration"]
    return manifest


def load_stage_checkpoint(path: str | os.PathLike, worker: StageWorker) -> dict[str, Any]:
    """Restore `worker` from a peer's own checkpoint of the same stage (`save_stage_checkpoint`); returns its
    manifest. Raises CheckpointError when it is missing, corrupted, or of another stage, model or split."""
    root = Path(path)
    manifest = read_manifest(root, PEER_MANIFEST, (("iteration", int), ("steps", int), ("stage", int),
                                                   ("model", dict), ("split", list), ("files", dict)))
    _expect_equal("stage", manifest["stage"], worker.stage)
    _expect_equal("model", manifest["model"], worker.config.to_dict())
    _expect_equal("split", manifest["split"], list(worker.split))
    weights = _load_tensors(root, f"stage-{worker.stage}.safetensors", manifest)
    optim = _load_tensors(root, f"stage-{worker.stage}-optimizer.safetensors", manifest)
    load_stage_tensors(worker, weights, optim, steps=manifest["steps"])
    return manifest


def load_model(path: str | os.PathLike, device: str = "cpu") -> tuple[Transformer, dict[str, Any]]:
    """The whole model from a checkpoint (for evaluation), and the checked manifest."""
    root = Path(path)
    manifest = read_manifest(root)
    try:
        cfg = ModelConfig.from_dict(manifest["model"])
        OptimConfig.from_dict(manifest["optim"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{root / MANIFEST}: {e}") from None
    model = Transformer(cfg, seed=manifest["seed"])
    state: dict[str, torch.Tensor] = {}
    for s in range(len(manifest["split"])):
        state.update(_load_tensors(root, f"stage-{s}.safetensors", manifest))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"checkpoint {root} does not fit its own model config: {e}") from None
    return model.to(device), manifest


def _expect_equal(name: str, saved: Any, current: Any) -> None:
    if saved == current:
        return
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current)):
            if saved.get(key) != current.get(key):
                raise CheckpointError(f"checkpoint was made with {name}.{key}={saved.get(key)!r}, this run has "
                                      f"{current.get(key)!r}")
    raise CheckpointError(f"checkpoint was made with {name}={saved!r}, this run has {current!r}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def param_digest(worker: StageWorker) -> str:
    """sha256 of the stage's parameters, in name order (equal digests = bit-identical weights)."""
    h = hashlib.sha256()
    for name, p in sorted(worker.module.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
