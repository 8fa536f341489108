"""Checkpoints: per-stage weights and optimizer state in safetensors, everything else in JSON. No pickle.

A checkpoint root holds one directory per save, `step-{iteration:08d}` (`-{n}` appended when that iteration was
saved before), and `latest`, a one-line file naming the current one. A step directory holds

- the manifest, `checkpoint.json` for a whole model: format version, the resolved model / optimizer / data
  config, the layer split, iteration and optimizer step, each data holder's shard position, and the SHA-256 of
  every file (`peer.json` for one peer's checkpoint of its stage);
- `stage-{s}.safetensors` (weights, full-model parameter names) and `stage-{s}-optimizer.safetensors`
  (AdamW moments and step counts, keyed `{param}.exp_avg` ...) for every stage;
- `rng.safetensors` (torch's CPU generator) and `tokenizer.json` when trained on a corpus, with the
  `tokenizer_config.json` beside the corpus's tokenizer file when it has one (an imported tokenizer's eos).

A checkpoint can also seed a new run (`load_initial_weights`, `load_initial_stage`): its stage weights only,
the optimizer fresh and the iteration 0, e.g. a Hugging Face model `skippipe import-hf` converted. A networked
run carries the SHA-256 of each stage file (`initial_weight_digests`) so that every peer starts from the same.

Crash safety: a save writes a fresh hidden directory, fsyncs every file and the directory, renames it to its
step name, then replaces `latest` atomically (temp file, fsync, `os.replace`, fsync of the root). Only then are
older step directories deleted, all but the new one and the one `latest` named before, so a crash at any point
leaves a complete checkpoint. Loading follows `latest` (a plain step name, else refused) and falls back, with a
warning, to the newest complete step directory when it is missing, incomplete, or a file's hash differs from
the manifest's. A root with the manifest directly in it (the flat layout of older builds) still loads.
Loading into a swarm whose model, split or optimizer differs is refused with the first differing field named.
One writer per root: two processes saving into the same root may delete each other's step directories.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from peers.durable import fsync_dir, fsync_file, sha256_file, write_durable
from peers.model import ModelConfig, Transformer
from peers.optim import OptimConfig
from peers.tokenizer import TOKENIZER_CONFIG
from peers.worker import StageWorker

CHECKPOINT_FORMAT = 1
MANIFEST = "checkpoint.json"
PEER_MANIFEST = "peer.json"
"""Manifest of one peer's own checkpoint of its stage."""
MAX_MANIFEST_BYTES = 16 << 20
LATEST = "latest"
"""The pointer file in a checkpoint root: the name of the current step directory."""
_STEP_DIR = re.compile(r"step-(\d{1,12})(?:-(\d{1,6}))?")
_TMP_PREFIX = ".tmp-step-"
_MOMENTS = ("exp_avg", "exp_avg_sq", "step")
_WHOLE_FIELDS = (("iteration", int), ("steps", int), ("seed", int), ("model", dict), ("optim", dict),
                 ("split", list), ("shards", dict), ("files", dict))
_PEER_FIELDS = (("iteration", int), ("steps", int), ("stage", int), ("model", dict), ("split", list),
                ("files", dict))

logger = logging.getLogger(__name__)


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
    """Write `swarm` (an InProcessSwarm) as a new step directory of checkpoint root `path` and point `latest` at
    it; returns the manifest's path. An interruption leaves the previous checkpoint in place."""
    steps = {w.steps for w in swarm.workers.values()}
    if len(steps) != 1:
        raise CheckpointError(f"workers disagree on the optimizer step ({sorted(steps)}); save between iterations")

    def write(out: Path) -> None:
        files: dict[str, str] = {}
        for s in range(swarm.schedule.num_stages):
            worker = swarm.stage_workers(s)[0]  # peers of a stage hold equal weights and moments
            weights, optim = stage_tensors(worker)
            files.update(_write_tensors(out, f"stage-{s}.safetensors", weights))
            files.update(_write_tensors(out, f"stage-{s}-optimizer.safetensors", optim))
        files.update(_write_tensors(out, "rng.safetensors", {"torch_cpu": torch.get_rng_state()}))
        data = None
        if swarm.corpus is not None:
            files["tokenizer.json"] = write_durable(out / "tokenizer.json", swarm.corpus.tokenizer.to_str().encode())
            sidecar = tokenizer_sidecar(swarm.corpus.config.tokenizer)
            if sidecar is not None:  # an imported tokenizer's eos/bos names: eval and export-hf need them
                files[TOKENIZER_CONFIG] = write_durable(out / TOKENIZER_CONFIG, sidecar)
            data = swarm.corpus.config.to_dict()
            data["paths"] = [str(Path(p).resolve()) for p in data["paths"]]
        first = next(iter(swarm.workers.values()))
        manifest = {
            "format": CHECKPOINT_FORMAT,
            "iteration": swarm.iteration,
            "steps": next(iter(steps)),
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
        write_durable(out / MANIFEST, json.dumps(manifest, indent=1).encode())

    return _save_step(Path(path), swarm.iteration, MANIFEST, write)


def save_stage_checkpoint(path: str | os.PathLike, worker: StageWorker, *, iteration: int, seed: int,
                          shard: Any = None, extra: dict[str, Any] | None = None) -> Path:
    """One peer's own checkpoint (its stage's weights and optimizer, its data position) as a new step directory
    of root `path`, in the same layout as `save_checkpoint` for that stage, so stage files from several peers can
    be gathered into a whole one; returns the manifest's path. An interruption leaves the previous one in place."""
    weights, optim = stage_tensors(worker)

    def write(out: Path) -> None:
        files: dict[str, str] = {}
        files.update(_write_tensors(out, f"stage-{worker.stage}.safetensors", weights))
        files.update(_write_tensors(out, f"stage-{worker.stage}-optimizer.safetensors", optim))
        manifest = {
            "format": CHECKPOINT_FORMAT, "stage": worker.stage, "iteration": iteration, "steps": worker.steps,
            "seed": seed, "model": worker.config.to_dict(), "optim": worker.optim_config.to_dict(),
            "split": list(worker.split), "shard": shard.state_dict() if shard is not None else None,
            "files": files, **(extra or {}),
        }
        write_durable(out / PEER_MANIFEST, json.dumps(manifest, indent=1).encode())

    return _save_step(Path(path), iteration, PEER_MANIFEST, write)


# ---- step directories and the `latest` pointer -----------------------------------------------
def _save_step(root: Path, iteration: int, manifest_name: str, write: Callable[[Path], None]) -> Path:
    """Run `write` into a fresh hidden directory of `root`, make it durable, switch `latest` to it, prune."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{_TMP_PREFIX}*"):  # left by a save that crashed
        shutil.rmtree(stale, ignore_errors=True)
    previous = _previous_step(root, manifest_name)
    tmp = root / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        write(tmp)
        fsync_dir(tmp)
        name = _free_step_name(root, iteration)
        os.rename(tmp, root / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root)
    pointer = root / f".{LATEST}.tmp"
    write_durable(pointer, f"{name}\n".encode())
    os.replace(pointer, root / LATEST)
    fsync_dir(root)
    for d in _step_dirs(root):
        if d.name not in (name, previous):
            shutil.rmtree(d, ignore_errors=True)
    return root / name / manifest_name


def _write_tensors(out: Path, name: str, tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    save_file(tensors, str(out / name), metadata={"format": str(CHECKPOINT_FORMAT)})
    fsync_file(out / name)
    return {name: sha256_file(out / name)}


def _step_key(name: str) -> tuple[int, int] | None:
    m = _STEP_DIR.fullmatch(name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def _step_dirs(root: Path) -> list[Path]:
    """The step directories of `root`, newest first (real directories only, never a link out of the root)."""
    found = [d for d in root.iterdir() if _step_key(d.name) is not None and d.is_dir() and not d.is_symlink()] \
        if root.is_dir() else []
    return sorted(found, key=lambda d: _step_key(d.name), reverse=True)


def _free_step_name(root: Path, iteration: int) -> str:
    name, n = f"step-{iteration:08d}", 0
    while os.path.lexists(root / name):
        n += 1
        name = f"step-{iteration:08d}-{n}"
    return name


def _read_latest(root: Path) -> str | None:
    """The step name in `root/latest`, or None (with a warning) when it is absent, unreadable or not a plain
    step name: its content is untrusted, so nothing like `../elsewhere` or an absolute path is ever followed."""
    pointer = root / LATEST
    if not pointer.is_file():
        if os.path.lexists(pointer):
            logger.warning("checkpoint pointer %s is not a regular file: ignored", pointer)
        return None
    raw, name = b"", None
    try:
        with open(pointer, "rb") as f:
            raw = f.read(64)
        name = raw.decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        pass
    if name is None or _step_key(name) is None:
        logger.warning("checkpoint pointer %s holds %r, not a step directory name: ignored", pointer, raw[:32])
        return None
    return name


def _previous_step(root: Path, manifest_name: str) -> str | None:
    """The step directory a new save must keep: the one `latest` names, else the newest with a manifest."""
    name = _read_latest(root) if os.path.lexists(root / LATEST) else None
    if name is not None and (root / name / manifest_name).is_file() and not (root / name).is_symlink():
        return name
    return next((d.name for d in _step_dirs(root) if (d / manifest_name).is_file()), None)


def has_checkpoint(path: str | os.PathLike, name: str = MANIFEST) -> bool:
    """Whether root `path` holds something that claims to be a checkpoint (loading it may still be refused)."""
    root = Path(path)
    return os.path.lexists(root / LATEST) or bool(_step_dirs(root)) or (root / name).is_file()


def resolve_checkpoint(path: str | os.PathLike, name: str = MANIFEST,
                       fields: tuple[tuple[str, type], ...] = ()) -> tuple[Path, dict[str, Any]]:
    """(directory, checked manifest) of the checkpoint that root `path` holds: the step directory `latest`
    names, else the newest complete one, else `path` itself in the flat layout of older builds.

    :param name: the manifest file (`checkpoint.json` for a whole model, `peer.json` for one peer's stage)
    :param fields: the fields it must have (default: those of the kind of checkpoint `name` says)
    :raises CheckpointError: nothing complete is there; the message says why the newest candidate was refused
    """
    root = Path(path)
    steps = _step_dirs(root)
    if not steps and not os.path.lexists(root / LATEST):
        return root, _check_manifest(root, name, fields)
    latest = _read_latest(root)
    candidates = ([root / latest] if latest is not None else []) + [d for d in steps if d.name != latest]
    first_error: CheckpointError | None = None
    for d in candidates:
        try:
            if d.is_symlink():
                raise CheckpointError(f"{d} is a link, not a step directory")
            manifest = _check_manifest(d, name, fields)
        except CheckpointError as e:
            logger.warning("checkpoint %s refused: %s", d, e)
            first_error = first_error or e
            continue
        if d.name != latest:
            logger.warning("checkpoint root %s: %s is not usable, loading %s instead", root, latest or LATEST, d.name)
        return d, manifest
    if first_error is None:
        raise CheckpointError(f"{root} is not a checkpoint directory (no step directory with a {name})")
    raise CheckpointError(f"{first_error}; no earlier complete checkpoint in {root}")


def read_manifest(path: str | os.PathLike, name: str = MANIFEST,
                  fields: tuple[tuple[str, type], ...] = ()) -> dict[str, Any]:
    """The checked manifest of the checkpoint that root `path` holds (see `resolve_checkpoint`)."""
    return resolve_checkpoint(path, name, fields)[1]


def _check_manifest(root: Path, name: str, fields: tuple[tuple[str, type], ...]) -> dict[str, Any]:
    """The manifest of step directory `root`, its format, fields and every file's hash checked."""
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
    for key, kind in fields or (_PEER_FIELDS if name == PEER_MANIFEST else _WHOLE_FIELDS):
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            raise CheckpointError(f"{mf}: field {key!r} is missing or not a {kind.__name__}")
    for file, digest in manifest["files"].items():
        if not isinstance(file, str) or "/" in file or "\\" in file or file.startswith("."):
            raise CheckpointError(f"{mf}: bad file name {file!r}")
        f = root / file
        if not f.is_file():
            raise CheckpointError(f"checkpoint file {f} is missing")
        if sha256_file(f) != digest:
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
    """Restore `swarm` (weights, optimizer, step, data positions, RNG) from checkpoint root `path` for an exact
    resume; returns the manifest."""
    root, manifest = resolve_checkpoint(path)
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
    """Restore `worker` from a peer's own checkpoint of the same stage (`save_stage_checkpoint`, root `path`);
    returns its manifest. Raises CheckpointError when it is missing, corrupted, or of another stage, model or split."""
    root, manifest = resolve_checkpoint(path, PEER_MANIFEST)
    _expect_equal("stage", manifest["stage"], worker.stage)
    _expect_equal("model", manifest["model"], worker.config.to_dict())
    _expect_equal("split", manifest["split"], list(worker.split))
    weights = _load_tensors(root, f"stage-{worker.stage}.safetensors", manifest)
    optim = _load_tensors(root, f"stage-{worker.stage}-optimizer.safetensors", manifest)
    load_stage_tensors(worker, weights, optim, steps=manifest["steps"])
    return manifest


# ---- starting a new run from a checkpoint's weights --------------------------------------------
MAX_SIDECAR_BYTES = 1 << 20


def tokenizer_sidecar(tokenizer_path: str | os.PathLike | None) -> bytes | None:
    """The `tokenizer_config.json` beside tokenizer file `tokenizer_path`, if there is one (None otherwise)."""
    if tokenizer_path is None:
        return None
    sidecar = Path(tokenizer_path).parent / TOKENIZER_CONFIG
    if not sidecar.is_file() or sidecar.stat().st_size > MAX_SIDECAR_BYTES:
        return None
    return sidecar.read_bytes()


def initial_weight_digests(path: str | os.PathLike, model: ModelConfig, split: tuple[int, ...] | list[int]
                           ) -> tuple[str, ...]:
    """SHA-256 of each stage's weights file in checkpoint root `path`, stage by stage, after checking that it
    holds `model` split as `split` (every file's hash is checked against its manifest on the way).

    :raises CheckpointError: no complete checkpoint there, or another model or split
    """
    root, manifest = resolve_checkpoint(path)
    _expect_equal("model", manifest["model"], model.to_dict())
    _expect_equal("split", manifest["split"], list(split))
    digests = []
    for s in range(len(split)):
        name = f"stage-{s}.safetensors"
        if name not in manifest["files"]:
            raise CheckpointError(f"checkpoint {root} has no {name}")
        digests.append(manifest["files"][name])
    return tuple(digests)


def load_initial_stage(path: str | os.PathLike, worker: StageWorker, digest: str | None = None) -> dict[str, Any]:
    """Start `worker` from the weights of its stage in the whole-model checkpoint root `path` (weights only: the
    optimizer stays fresh, step 0); returns the manifest.

    :param digest: the SHA-256 the run says that stage's file has (`initial_weight_digests`); a file that differs
      is refused, so every peer of a run starts from the same weights
    :raises CheckpointError: missing or corrupted, of another model or split, or not the run's weights
    """
    root, manifest = resolve_checkpoint(path)
    _check_initial(root, manifest, worker, digest)
    load_stage_tensors(worker, _load_tensors(root, f"stage-{worker.stage}.safetensors", manifest), {}, steps=0)
    return manifest


def load_initial_weights(path: str | os.PathLike, swarm: Any) -> dict[str, Any]:
    """Start every worker of `swarm` (an InProcessSwarm) from the weights of checkpoint root `path` (weights only:
    optimizers fresh, iteration 0; unlike `load_checkpoint`, no exact resume); returns the manifest."""
    root, manifest = resolve_checkpoint(path)
    for worker in swarm.workers.values():
        _check_initial(root, manifest, worker, None)
    for s in range(swarm.schedule.num_stages):
        weights = _load_tensors(root, f"stage-{s}.safetensors", manifest)
        for worker in swarm.stage_workers(s):
            load_stage_tensors(worker, weights, {}, steps=0)
    swarm.iteration = 0
    return manifest


def _check_initial(root: Path, manifest: dict[str, Any], worker: StageWorker, digest: str | None) -> None:
    _expect_equal("model", manifest["model"], worker.config.to_dict())
    _expect_equal("split", manifest["split"], list(worker.split))
    name = f"stage-{worker.stage}.safetensors"
    if digest is not None and manifest["files"].get(name) != digest:
        raise CheckpointError(f"{root / name} is not this run's initial weights of stage {worker.stage} (SHA-256 "
                              f"{str(manifest['files'].get(name))[:12]}..., the run's is {digest[:12]}...): "
                              "point --init-from at a copy of the checkpoint the run started from")


def load_model(path: str | os.PathLike, device: str = "cpu") -> tuple[Transformer, dict[str, Any]]:
    """The whole model from checkpoint root `path` (for evaluation), and the checked manifest."""
    root, manifest = resolve_checkpoint(path)
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


def param_digest(worker: StageWorker) -> str:
    """sha256 of the stage's parameters, in name order (equal digests = bit-identical weights)."""
    h = hashlib.sha256()
    for name, p in sorted(worker.module.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
