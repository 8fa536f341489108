"""Gathering a networked run's model: several peers' own stage checkpoints -> one whole-model checkpoint.

Each peer of a networked run writes only its own stage (`save_stage_checkpoint`, `peer.json` manifests) into its
`--checkpoint-dir`, a root that keeps the step directory `latest` names and the one before it. `gather_checkpoint`
reads every step directory of every root given and

1. checks that they come from one run: model, split, seed, optimizer config, run id and data config agree
   (refused with the first differing field named);
2. picks the newest iteration that every stage has, across all step directories;
3. for each stage, takes a candidate of that iteration. Peers of a stage hold bit-identical weights after their
   averaging, so candidates should agree; if they do not (by the SHA-256 of the stage file), the weights most
   candidates agree on win, with a warning;
4. writes `save_checkpoint`'s format (`checkpoint.json`, one `stage-{s}.safetensors` per stage, copied byte for
   byte) as a new step directory of an empty root, so `skippipe eval` and `skippipe export-hf` read it.

Optimizer moments are kept when every chosen candidate has them (they are equal across a stage too); data
positions are not (`shards` is empty: the result is for evaluation and export, and seeding new runs, not for an
exact resume of the networked run). A step directory that fails its hash check is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from peers.checkpoint import (
    CHECKPOINT_FORMAT,
    MANIFEST,
    PEER_MANIFEST,
    CheckpointError,
    _save_step,
    _step_dirs,
    _write_tensors,
    resolve_checkpoint,
    tokenizer_sidecar,
)
from peers.data import Corpus, DataConfig
from peers.durable import fsync_file, sha256_file, write_durable
from peers.tokenizer import TOKENIZER_CONFIG, load_tokenizer

logger = logging.getLogger(__name__)

_FIELDS = (("iteration", int), ("steps", int), ("stage", int), ("seed", int), ("model", dict), ("optim", dict),
           ("split", list), ("files", dict))
_RUN_FIELDS = ("model", "split", "seed", "optim", "run_id", "data")
"""Manifest fields every peer checkpoint of one run has in common."""
_RECORDED_LATER = ("run_id", "data")
"""Compared only where both checkpoints record them (older builds' peers wrote no `data`)."""
_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
"""safetensors dtype -> the name `save_checkpoint` records."""


@dataclass(frozen=True)
class Candidate:
    """One peer's checkpoint of one stage at one iteration: a complete step directory, its hashes checked."""

    step_dir: Path
    manifest: dict[str, Any]

    @property
    def stage(self) -> int:
        return self.manifest["stage"]

    @property
    def iteration(self) -> int:
        return self.manifest["iteration"]

    @property
    def weights_digest(self) -> str:
        return self.manifest["files"].get(f"stage-{self.stage}.safetensors", "")

    def describe(self) -> str:
        peer = self.manifest.get("peer")
        return f"{self.step_dir}" + (f" (peer {peer})" if isinstance(peer, str) else "")


@dataclass
class GatherResult:
    """What `gather_checkpoint` wrote and where each stage came from."""

    manifest_path: Path
    iteration: int
    sources: dict[int, Candidate]
    agreeing: dict[int, tuple[int, int]]
    """stage -> (candidates with the chosen weights, candidates at that iteration)."""
    optimizer: bool
    tokenizer: bool
    warnings: list[str] = field(default_factory=list)


def holds_peer_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` is a peer checkpoint root (or one step directory of it)."""
    root = Path(path)
    return (root / PEER_MANIFEST).is_file() or any((d / PEER_MANIFEST).is_file() for d in _step_dirs(root))


def peer_roots(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The peer checkpoint roots among `paths`: each path that is one, else its subdirectories that are
    (a directory the peers' `--checkpoint-dir`s were copied into).

    :raises CheckpointError: a path holds no peer checkpoint (a whole-model checkpoint is named as one)
    """
    roots: list[Path] = []
    for p in map(Path, paths):
        if holds_peer_checkpoint(p):
            roots.append(p)
            continue
        subs = sorted(d for d in p.iterdir() if d.is_dir() and not d.is_symlink() and holds_peer_checkpoint(d)) \
            if p.is_dir() else []
        if not subs:
            whole = (p / MANIFEST).is_file() or any((d / MANIFEST).is_file() for d in _step_dirs(p))
            why = "it holds a whole-model checkpoint" if whole else f"no step directory with a {PEER_MANIFEST}"
            raise CheckpointError(f"no peer checkpoint in {p} ({why})")
        roots.extend(subs)
    return roots


def _candidates(root: Path, warnings: list[str]) -> list[Candidate]:
    """Every complete step directory of peer root `root` (the flat layout too), newest first."""
    dirs = [root] if (root / PEER_MANIFEST).is_file() else _step_dirs(root)
    found = []
    for d in dirs:
        if not (d / PEER_MANIFEST).is_file():
            continue
        try:
            step, manifest = resolve_checkpoint(d, PEER_MANIFEST, _FIELDS)
        except CheckpointError as e:
            warnings.append(f"skipped {d}: {e}")
            continue
        found.append(Candidate(step, manifest))
    if not found:
        raise CheckpointError(f"no complete peer checkpoint in {root}" + (f": {warnings[-1]}" if warnings else ""))
    return found


def _check_one_run(candidates: list[Candidate]) -> int:
    """The number of stages, after checking every candidate belongs to the same run as the first."""
    first = candidates[0]
    for c in candidates[1:]:
        for key in _RUN_FIELDS:
            a, b = first.manifest.get(key), c.manifest.get(key)
            if a == b or (key in _RECORDED_LATER and (a is None or b is None)):
                continue
            where = key
            if isinstance(a, dict) and isinstance(b, dict):
                where += "." + next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
                a, b = a.get(where.split(".", 1)[1]), b.get(where.split(".", 1)[1])
            raise CheckpointError(f"peer checkpoints of different runs: {where} is {a!r} in {first.step_dir}, "
                                  f"{b!r} in {c.step_dir}")
    stages = len(first.manifest["split"])
    for c in candidates:
        if not 0 <= c.stage < stages:
            raise CheckpointError(f"{c.step_dir}: stage {c.stage} is not one of the split's {stages} stages")
    return stages


def choose_iteration(candidates: list[Candidate], stages: int) -> int:
    """The newest iteration every one of `stages` stages has a candidate of.

    :raises CheckpointError: a stage has none (named, with the stages found), or no iteration is common
    """
    by_stage: dict[int, set[int]] = {}
    for c in candidates:
        by_stage.setdefault(c.stage, set()).add(c.iteration)
    missing = [s for s in range(stages) if s not in by_stage]
    if missing:
        raise CheckpointError(f"no checkpoint of stage {', '.join(map(str, missing))} among the peer checkpoints "
                              f"given (found stage(s) {', '.join(map(str, sorted(by_stage)))} of {stages})")
    common = set.intersection(*by_stage.values())
    if not common:
        listed = "; ".join(f"stage {s}: {', '.join(map(str, sorted(its)))}" for s, its in sorted(by_stage.items()))
        raise CheckpointError(f"no iteration is saved for every stage ({listed})")
    return max(common)


def _choose(stage: int, group: list[Candidate], warnings: list[str]) -> tuple[Candidate, int]:
    """The candidate whose weights most of `group` agree on (the first given on a tie), and how many agree."""
    votes = Counter(c.weights_digest for c in group)
    digest = max(votes, key=votes.__getitem__)  # a Counter keeps first-seen order: ties go to the first given
    chosen, count = next(c for c in group if c.weights_digest == digest), votes[digest]
    if len(votes) > 1:
        others = ", ".join(str(c.step_dir) for c in group if c.weights_digest != digest)
        how = "most of them agree on" if count * 2 > len(group) else "no majority: took the first given,"
        warnings.append(f"stage {stage}: the {len(group)} checkpoints of iteration {chosen.iteration} hold "
                        f"{len(votes)} different weights; {how} {chosen.step_dir} ({count} of {len(group)}); "
                        f"differing: {others}")
    return chosen, count


def gather_checkpoint(paths: Sequence[str | os.PathLike], out: str | os.PathLike, *,
                      tokenizer: str | os.PathLike | None = None) -> GatherResult:
    """Gather the peer checkpoints under `paths` (see `peer_roots`) into a whole-model checkpoint in the new or
    empty directory `out`, at the newest iteration every stage has. Everything is checked before anything is
    written.

    :param tokenizer: a tokenizer.json to store with it (default: the run's `data.tokenizer`, when the peers
      recorded their data config and that file exists here); `skippipe eval` needs one
    :raises CheckpointError: no peer checkpoint, a stage missing, no common iteration, checkpoints of different
      runs, or `out` not empty
    """
    warnings: list[str] = []
    candidates = [c for root in peer_roots(paths) for c in _candidates(root, warnings)]
    stages = _check_one_run(candidates)
    iteration = choose_iteration(candidates, stages)
    sources, agreeing = {}, {}
    for s in range(stages):
        group = [c for c in candidates if c.stage == s and c.iteration == iteration]
        sources[s], count = _choose(s, group, warnings)
        agreeing[s] = (count, len(group))
    steps = {c.manifest["steps"] for c in sources.values()}
    if len(steps) > 1:
        warnings.append(f"the stages chosen disagree on the optimizer step ({sorted(steps)}); recorded "
                        f"{max(steps)}")
    optimizer = all(f"stage-{s}-optimizer.safetensors" in c.manifest["files"] for s, c in sources.items())
    first = sources[0].manifest
    data = next((c.manifest["data"] for c in candidates if isinstance(c.manifest.get("data"), dict)), None)
    tok = _tokenizer(tokenizer, data, first["model"], warnings)
    dtype = _dtype(sources[0])
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise CheckpointError(f"output directory {dest} exists and is not empty")
    for w in warnings:
        logger.warning("%s", w)

    def write(step: Path) -> None:
        files: dict[str, str] = {}
        for s, c in sources.items():
            for name in (f"stage-{s}.safetensors", f"stage-{s}-optimizer.safetensors"):
                if name.endswith("optimizer.safetensors") and not optimizer:
                    files.update(_write_tensors(step, name, {}))
                    continue
                files[name] = _copy(c.step_dir / name, step)
                if files[name] != c.manifest["files"][name]:
                    raise CheckpointError(f"{c.step_dir / name} changed while it was gathered")
        files.update(_write_tensors(step, "rng.safetensors", {}))
        if tok is not None:
            files["tokenizer.json"] = write_durable(step / "tokenizer.json", tok[0])
            if tok[1] is not None:
                files[TOKENIZER_CONFIG] = write_durable(step / TOKENIZER_CONFIG, tok[1])
        manifest = {
            "format": CHECKPOINT_FORMAT, "iteration": iteration, "steps": max(steps), "seed": first["seed"],
            "dtype": dtype, "model": first["model"], "optim": first["optim"],
            "split": first["split"], "data": data, "shards": {}, "schedule": None, "files": files,
            "run_id": next((c.manifest["run_id"] for c in candidates if c.manifest.get("run_id")), None),
            "gathered_from": {str(s): {"step_dir": str(c.step_dir.resolve()), "peer": c.manifest.get("peer"),
                                       "agreeing": list(agreeing[s])} for s, c in sources.items()},
        }
        write_durable(step / MANIFEST, json.dumps(manifest, indent=1).encode())

    path = _save_step(dest, iteration, MANIFEST, write)
    return GatherResult(path, iteration, sources, agreeing, optimizer, tok is not None, warnings)


def _tokenizer(given: str | os.PathLike | None, data: dict[str, Any] | None, model: dict[str, Any],
               warnings: list[str]) -> tuple[bytes, bytes | None] | None:
    """(tokenizer.json, its tokenizer_config.json or None) to store: file `given`, else the run's `data.tokenizer`
    when that file is here, else the BPE the peers trained on the run's corpus, rebuilt here from the same corpus
    (cached, as on the peers); None with a warning when the corpus is not here either.

    :raises CheckpointError: `given` is not a tokenizer file this model can use
    """
    if given is None and data is None:
        return None
    named = given if given is not None else data.get("tokenizer")
    named = named if isinstance(named, (str, os.PathLike)) else None
    try:
        if named is not None and (given is not None or Path(named).is_file()):
            tok, sidecar = load_tokenizer(named), tokenizer_sidecar(named)
            raw = Path(named).read_bytes()
        else:
            tok, sidecar = Corpus.build(DataConfig.from_dict(data)).tokenizer, None
            raw = tok.to_str().encode()
    except (ValueError, TypeError, OSError) as e:
        if given is not None:
            raise CheckpointError(str(e)) from None
        warnings.append(f"no tokenizer stored: neither data.tokenizer nor the run's corpus is readable here ({e})")
        return None
    if tok.get_vocab_size() > model.get("vocab_size", 0):
        raise CheckpointError(f"tokenizer {named or '(trained on the corpus)'} has {tok.get_vocab_size()} tokens, "
                              f"more than the model's vocab_size {model.get('vocab_size')}")
    return raw, sidecar


def _copy(src: Path, step: Path, name: str | None = None) -> str:
    """Copy `src` into step directory `step` byte for byte; the SHA-256 of what was written."""
    dst = step / (name or src.name)
    shutil.copyfile(src, dst)
    fsync_file(dst)
    return sha256_file(dst)


def _dtype(c: Candidate) -> str:
    """The dtype of a stage file's weights, from its header (nothing else is loaded)."""
    try:
        with safe_open(str(c.step_dir / f"stage-{c.stage}.safetensors"), framework="pt") as f:
            names = list(f.keys())
            found = f.get_slice(names[0]).get_dtype() if names else "F32"
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"checkpoint file {c.step_dir}/stage-{c.stage}.safetensors could not be read: "
                              f"{e}") from None
    return _DTYPES.get(found, found.lower())
