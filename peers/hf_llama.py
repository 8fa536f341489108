"""Hugging Face Llama directories <-> skippipe stage checkpoints. Local files only, no network, no pickle.

- `read_hf_config`: a `config.json` -> `ModelConfig` and the bos/eos ids; anything but a plain Llama is refused.
- `HFWeights`: the tensors of `model.safetensors` or of the shards an `model.safetensors.index.json` names,
  read lazily (headers first: names, shapes and dtypes are checked before any tensor is loaded).
- `import_hf` / `export_hf`: the conversions. Parameter names map one to one (`hf_name`); the only change
  to a value is the row order of q/k projections:

  HF's Llama rotates dimension i of a head with i + head_dim/2 (`rotate_half`), our `apply_rotary` rotates
  (2i, 2i+1). Importing permutes q/k rows into our order, exactly the inverse of the permutation HF's own
  Meta-to-HF converter applies; export applies that converter's permutation. q.k within a head is unchanged
  by permuting both alike, so the model computes the same function with one rotary formula, and the round
  trip is bit-exact. (A second rotary layout in the model would cost a config field and a branch in every
  block, to the same effect.)

An import writes a whole checkpoint of `peers.checkpoint`'s format at iteration 0: `step-00000000/` with one
`stage-{s}.safetensors` per stage (the split balanced, stage 0 holding embedding and head), empty optimizer
and RNG files, `tokenizer.json` and a `tokenizer_config.json` naming its eos/bos tokens (the data path ends
each document with that eos, `peers.tokenizer.end_of_text_id`), the manifest, and `latest`. Beside it,
`run.toml` describes the imported architecture in a `[model]` table.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

from peers.checkpoint import CHECKPOINT_FORMAT, LATEST, MANIFEST, resolve_checkpoint
from peers.data import DataConfig
from peers.durable import fsync_dir, fsync_file, sha256_file, write_durable
from peers.model import ModelConfig
from peers.optim import OptimConfig
from peers.stage import balanced_split, check_split, stage_template
from peers.tokenizer import (
    TOKENIZER_CONFIG,
    end_of_text_id,
    read_tokenizer_file,
    special_token,
)
from scheduler.path_rules import never_trained_stages

HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
HF_TOKENIZER = "tokenizer.json"
MAX_JSON_BYTES = 16 << 20
"""A config.json or shard index larger than this is refused before reading."""
DEFAULT_MAX_SHARD_BYTES = 5 << 30
"""Exports larger than this are written as numbered shards with an index (HF's own default is 5 GB)."""
FLOAT_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
"""safetensors dtype -> torch dtype of the weights we convert (anything else, e.g. quantized, is refused)."""
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
"""Buffers older transformers versions saved; recomputed, never read."""
_BLOCK_NAMES = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


class HFFormatError(ValueError):
    """A directory that is not a Llama checkpoint this build can convert; the message says what is wrong."""


@dataclass(frozen=True)
class SpecialTokens:
    bos_token_id: int | None
    eos_token_id: int | None


# ---- names and values ------------------------------------------------------------------------
def hf_name(name: str) -> str:
    """The Hugging Face Llama name of our parameter `name` (`layers.3.attention.wq.weight` ->
    `model.layers.3.self_attn.q_proj.weight`)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    _, index, rest = name.split(".", 2)
    return f"model.layers.{index}.{_BLOCK_NAMES[rest]}"


def _rotary_heads(name: str, cfg: ModelConfig) -> int | None:
    """Heads of a q/k projection (their rows are permuted between rotary layouts), else None."""
    if name.endswith("attention.wq.weight"):
        return cfg.n_heads
    if name.endswith("attention.wk.weight"):
        return cfg.kv_heads
    return None


def halves_to_pairs(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q/k projection rows from HF's rotary layout (i with i + hd/2) to ours ((2i, 2i+1)); w is (nh * hd, C)."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)  # (nh*hd, C)


def pairs_to_halves(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of `halves_to_pairs` (the permutation of HF's convert_llama_weights_to_hf.py)."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)  # (nh*hd, C)


# ---- config.json -----------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise HFFormatError(f"{path} is missing")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise HFFormatError(f"{path} is larger than {MAX_JSON_BYTES} bytes")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HFFormatError(f"{path} is not valid JSON: {e}") from None


def _token_id(value: Any, key: str, path: Path) -> int | None:
    if isinstance(value, list) and value:  # e.g. Llama 3.1: [end_of_text, end_of_message, end_of_turn]
        value = value[0]
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise HFFormatError(f"{path}: {key} must be a token id, got {value!r}")


def read_hf_config(hf_dir: str | os.PathLike) -> tuple[ModelConfig, SpecialTokens]:
    """The architecture and bos/eos ids of a Llama `config.json` (transformers 4 or 5 layout).

    Keys HF gives defaults to get HF's defaults (num_key_value_heads = num_attention_heads,
    max_position_embeddings 2048, rms_norm_eps 1e-6, rope_theta 10000, untied embeddings).
    :raises HFFormatError: not a Llama config, a required key missing or mistyped, or a feature we lack
    """
    path = Path(hf_dir) / HF_CONFIG
    raw = _read_json(path)
    if not isinstance(raw, dict):
        raise HFFormatError(f"{path} must hold a JSON object")
    if raw.get("model_type") != "llama":
        raise HFFormatError(f"{path.parent} is not a Llama checkpoint: model_type is {raw.get('model_type')!r}, "
                            "only 'llama' is supported")
    arch = raw.get("architectures")
    if arch is not None and (not isinstance(arch, list) or "LlamaForCausalLM" not in arch):
        raise HFFormatError(f"{path.parent} is not a Llama checkpoint: architectures is {arch!r}, "
                            "expected LlamaForCausalLM")

    def get(key: str, kind: type | tuple[type, ...], default: Any = KeyError) -> Any:
        if key not in raw or (raw[key] is None and default is not KeyError):
            if default is KeyError:
                raise HFFormatError(f"{path} has no {key!r}: not a complete Llama config")
            return default
        value = raw[key]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise HFFormatError(f"{path}: {key} has the wrong type ({value!r})")
        return value

    for key, unsupported in (("hidden_act", lambda v: v != "silu"), ("attention_bias", bool),
                             ("mlp_bias", bool)):
        if key in raw and unsupported(raw[key]):
            raise HFFormatError(f"{path}: {key}={raw[key]!r} is not supported (plain Llama has silu and no biases)")
    for key in ("rope_scaling", "rope_parameters"):  # transformers 4 / 5
        rope = raw.get(key)
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
        if rope_type not in (None, "default"):
            raise HFFormatError(f"{path}: {key} {rope_type!r} is not supported (only plain rotary embeddings, "
                                "rope_type 'default', without scaling)")
    rope = raw.get("rope_parameters")
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = get("rope_theta", (int, float), 10000.0) if theta is None else theta
    dim, heads = get("hidden_size", int), get("num_attention_heads", int)
    kv = get("num_key_value_heads", int, heads)
    if "head_dim" in raw and raw["head_dim"] is not None and (heads < 1 or raw["head_dim"] != dim // heads):
        raise HFFormatError(f"{path}: head_dim={raw['head_dim']!r} differs from hidden_size / num_attention_heads "
                            "(not supported)")
    try:
        cfg = ModelConfig(vocab_size=get("vocab_size", int), dim=dim, n_layers=get("num_hidden_layers", int),
                          n_heads=heads, ffn_dim=get("intermediate_size", int),
                          max_seq_len=get("max_position_embeddings", int, 2048),
                          rope_theta=float(theta) if isinstance(theta, (int, float)) else theta,
                          norm_eps=float(get("rms_norm_eps", (int, float), 1e-6)),
                          n_kv_heads=None if kv == heads else kv,
                          tie_embeddings=get("tie_word_embeddings", bool, False))
        cfg.validate()
    except ValueError as e:
        raise HFFormatError(f"{path}: {e}") from None
    special = SpecialTokens(_token_id(raw.get("bos_token_id"), "bos_token_id", path),
                            _token_id(raw.get("eos_token_id"), "eos_token_id", path))
    return cfg, special


# ---- safetensors weights ---------------------------------------------------------------------
class HFWeights:
    """The tensors of a HF directory's safetensors weights, by name, read lazily from their file."""

    def __init__(self, hf_dir: str | os.PathLike) -> None:
        root = Path(hf_dir)
        if (root / HF_INDEX).is_file():
            index = _read_json(root / HF_INDEX)
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise HFFormatError(f"{root / HF_INDEX} has no weight_map of tensor name -> shard file")
            files = sorted(set(weight_map.values()))
        elif (root / HF_WEIGHTS).is_file():
            weight_map, files = None, [HF_WEIGHTS]
        else:
            raise HFFormatError(f"{root} has no {HF_WEIGHTS} or {HF_INDEX} (only safetensors weights are read; "
                                "pytorch_model.bin is pickle and refused)")
        self.files: dict[str, Any] = {}
        self.where: dict[str, str] = {}
        for name in files:
            if "/" in name or "\\" in name or name.startswith("."):
                raise HFFormatError(f"{root / HF_INDEX} names a bad shard file {name!r}")
            if not (root / name).is_file():
                raise HFFormatError(f"shard {name} is missing from {root}")
            try:
                self.files[name] = safe_open(str(root / name), framework="pt")
            except (SafetensorError, OSError) as e:
                raise HFFormatError(f"shard {root / name} could not be read: {e}") from None
            for key in self.files[name].keys():
                if key in self.where:
                    raise HFFormatError(f"tensor {key} is in both {self.where[key]} and {name}")
                self.where[key] = name
        for key, name in (weight_map or {}).items():
            if self.where.get(key) != name:
                raise HFFormatError(f"{root / HF_INDEX} puts {key} in {name}, which does not hold it")

    def names(self) -> set[str]:
        return set(self.where)

    def check(self, name: str, shape: tuple[int, ...]) -> str:
        """The dtype name of tensor `name`, refusing it if absent, not float, or not of `shape`."""
        if name not in self.where:
            raise HFFormatError(f"tensor {name} is missing from the checkpoint")
        piece = self.files[self.where[name]].get_slice(name)
        dtype, found = piece.get_dtype(), tuple(piece.get_shape())
        if dtype not in FLOAT_DTYPES:
            raise HFFormatError(f"tensor {name} has dtype {dtype}; only float weights (F16, BF16, F32, F64) are "
                                "imported, not quantized ones")
        if found != tuple(shape):
            raise HFFormatError(f"tensor {name} has shape {list(found)}, config.json implies {list(shape)}")
        return dtype

    def get(self, name: str) -> torch.Tensor:
        return self.files[self.where[name]].get_tensor(name)


def _expected(cfg: ModelConfig, split: tuple[int, ...]) -> Iterator[tuple[int, str, tuple[int, ...]]]:
    """(stage, our name, shape) of every parameter, stage by stage."""
    for s in range(len(split)):
        for name, shape in stage_template(cfg, split, s).items():
            yield s, name, tuple(shape)


# ---- import ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImportResult:
    step_dir: Path
    run_toml: Path
    config: ModelConfig
    split: tuple[int, ...]
    dtype: str
    tokenizer: bool


def import_hf(hf_dir: str | os.PathLike, out: str | os.PathLike, stages: int) -> ImportResult:
    """Convert HF Llama directory `hf_dir` into a skippipe checkpoint of `stages` stages in the new or empty
    directory `out`, and write `out/run.toml`. Everything is checked before anything is written.

    :raises HFFormatError: `hf_dir` is not a Llama checkpoint we can convert, or `out` is not empty
    """
    src, root = Path(hf_dir), Path(out)
    cfg, special = read_hf_config(src)
    try:
        split = balanced_split(cfg.n_layers, stages)
    except ValueError as e:
        raise HFFormatError(str(e)) from None
    weights = HFWeights(src)
    dtypes = {name: weights.check(hf_name(name), shape) for _, name, shape in _expected(cfg, split)}
    used = {hf_name(n) for n in dtypes}
    extra = sorted(n for n in weights.names() - used if not n.endswith(_IGNORED_SUFFIXES))
    if cfg.tie_embeddings and extra == ["lm_head.weight"] \
            and torch.equal(weights.get("lm_head.weight"), weights.get("model.embed_tokens.weight")):
        extra = []  # a tied checkpoint that saved its head anyway
    if extra:
        raise HFFormatError(f"unexpected tensor(s) {', '.join(extra[:3])} in {src}: not a plain Llama"
                            + (" (tie_word_embeddings is true but lm_head.weight differs from the embedding)"
                               if "lm_head.weight" in extra and cfg.tie_embeddings else ""))
    tok, bos, eos = _read_tokenizer(src, cfg, special)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise HFFormatError(f"output directory {root} exists and is not empty")
    dtype = str(FLOAT_DTYPES[dtypes["tok_embeddings.weight"]]).removeprefix("torch.")

    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-import-{uuid.uuid4().hex}"
    tmp.mkdir()
    step = root / "step-00000000"
    try:
        files: dict[str, str] = {}
        for s in range(len(split)):
            tensors = {}
            for name in stage_template(cfg, split, s):
                t = weights.get(hf_name(name))
                heads = _rotary_heads(name, cfg)
                tensors[name] = (halves_to_pairs(t, heads) if heads else t).contiguous()
            files[f"stage-{s}.safetensors"] = _save(tmp / f"stage-{s}.safetensors", tensors)
            files[f"stage-{s}-optimizer.safetensors"] = _save(tmp / f"stage-{s}-optimizer.safetensors", {})
        files["rng.safetensors"] = _save(tmp / "rng.safetensors", {})
        data = None
        if tok is not None:
            files[HF_TOKENIZER] = write_durable(tmp / HF_TOKENIZER, (src / HF_TOKENIZER).read_bytes())
            names = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": tok.id_to_token(eos),
                     "bos_token": None if bos is None else tok.id_to_token(bos)}
            files[TOKENIZER_CONFIG] = write_durable(tmp / TOKENIZER_CONFIG, json.dumps(names, indent=1).encode())
            data = DataConfig(tokenizer=str((step / HF_TOKENIZER).resolve()), vocab_size=tok.get_vocab_size(),
                              seq_len=min(64, cfg.max_seq_len)).to_dict()
        manifest = {
            "format": CHECKPOINT_FORMAT, "iteration": 0, "steps": 0, "seed": 0, "dtype": dtype,
            "model": cfg.to_dict(), "optim": OptimConfig().to_dict(), "split": list(split), "data": data,
            "shards": {}, "schedule": None, "files": files,
            "imported_from": {"huggingface": str(src.resolve()), "bos_token_id": bos, "eos_token_id": eos},
        }
        write_durable(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        fsync_dir(tmp)
        os.rename(tmp, step)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_durable(root / f".{LATEST}.tmp", f"{step.name}\n".encode())
    os.replace(root / f".{LATEST}.tmp", root / LATEST)
    fsync_dir(root)
    run_toml = root / "run.toml"
    write_durable(run_toml, _run_toml(src, cfg, len(split), data).encode())
    return ImportResult(step, run_toml, cfg, split, dtype, tok is not None)


def _read_tokenizer(src: Path, cfg: ModelConfig, special: SpecialTokens
                    ) -> tuple[Tokenizer | None, int | None, int | None]:
    """The directory's tokenizer.json (None if it has none) and its bos/eos ids, checked against the model."""
    path = src / HF_TOKENIZER
    if not path.is_file():
        return None, special.bos_token_id, special.eos_token_id
    try:
        tok = read_tokenizer_file(path)
    except ValueError as e:
        raise HFFormatError(str(e)) from None
    if tok.get_vocab_size() > cfg.vocab_size:
        raise HFFormatError(f"{path} has {tok.get_vocab_size()} tokens, more than the model's vocab_size "
                            f"{cfg.vocab_size}")
    bos, eos = special.bos_token_id, special.eos_token_id
    try:
        if eos is None and special_token(path, "eos_token") is not None:
            eos = end_of_text_id(tok, path)  # named in the directory's own tokenizer_config.json
        if bos is None and special_token(path, "bos_token") is not None:
            bos = tok.token_to_id(special_token(path, "bos_token"))
    except ValueError as e:
        raise HFFormatError(str(e)) from None
    if eos is None:
        raise HFFormatError(f"{src} names no end-of-text token (eos_token_id in config.json or eos_token in "
                            f"{TOKENIZER_CONFIG}); the data path needs one")
    for key, value in (("eos_token_id", eos), ("bos_token_id", bos)):
        if value is not None and tok.id_to_token(value) is None:
            raise HFFormatError(f"{key}={value} is not a token of {path}")
    return tok, bos, eos


DEFAULT_SKIP = 0.33
"""`RunConfig.skip`'s default, which the written run.toml keeps unless it leaves a stage untrained."""


def _run_toml(src: Path, cfg: ModelConfig, stages: int, data: dict[str, Any] | None) -> str:
    lines = [f"# skippipe import-hf of {json.dumps(str(src.resolve()))}: the imported architecture", "",
             "[run]", f"stages = {stages}"]
    if never_trained_stages(stages, DEFAULT_SKIP):  # the default skip would leave stages off every path
        lines.append("skip = 0.0")
    lines += ["", "[model]  # peers.model.ModelConfig fields"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in cfg.to_dict().items() if v is not None]
    if data is not None:
        lines += ["", "[data]", f"tokenizer = {_toml_value(data['tokenizer'])}", f"seq_len = {data['seq_len']}"]
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def _save(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    save_file(tensors, str(path), metadata={"format": str(CHECKPOINT_FORMAT)})
    fsync_file(path)
    return sha256_file(path)


# ---- export ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportResult:
    files: tuple[str, ...]
    config: ModelConfig
    num_params: int


def export_hf(ckpt: str | os.PathLike, out: str | os.PathLike, *,
              max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> ExportResult:
    """Write the whole-model checkpoint at root `ckpt` as a HF Llama directory `out` (new or empty):
    config.json, generation_config.json, model.safetensors (numbered shards and an index past
    `max_shard_bytes`), and the tokenizer with its tokenizer_config.json when the checkpoint has one.

    :raises HFFormatError: `out` is not empty, or the checkpoint's stage files do not fit its model config
    :raises CheckpointError: `ckpt` holds no complete checkpoint
    """
    step, manifest = resolve_checkpoint(ckpt)
    try:
        cfg = ModelConfig.from_dict(manifest["model"])
        split = check_split(manifest["split"], cfg.n_layers)
    except (TypeError, ValueError) as e:
        raise HFFormatError(f"{step / MANIFEST}: {e}") from None
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise HFFormatError(f"output directory {dest} exists and is not empty")
    stage_files = {}
    for s in range(len(split)):
        name = f"stage-{s}.safetensors"
        if name not in manifest["files"]:
            raise HFFormatError(f"checkpoint {step} has no {name}")
        try:
            stage_files[s] = safe_open(str(step / name), framework="pt")
        except (SafetensorError, OSError) as e:
            raise HFFormatError(f"checkpoint file {step / name} could not be read: {e}") from None
    plan: list[tuple[int, str, int]] = []  # (stage, our name, bytes), HF order within each stage
    dtypes = set()
    for s, name, shape in _expected(cfg, split):
        if name not in stage_files[s].keys():
            raise HFFormatError(f"checkpoint file stage-{s}.safetensors has no {name}")
        piece = stage_files[s].get_slice(name)
        if tuple(piece.get_shape()) != shape or piece.get_dtype() not in FLOAT_DTYPES:
            raise HFFormatError(f"{name} in stage-{s}.safetensors is {piece.get_dtype()} {piece.get_shape()}, "
                                f"the model config implies a float tensor of shape {list(shape)}")
        dtypes.add(piece.get_dtype())
        plan.append((s, name, FLOAT_DTYPES[piece.get_dtype()].itemsize * int(torch.Size(shape).numel())))
    shards: list[list[tuple[int, str, int]]] = [[]]
    for entry in plan:
        if shards[-1] and sum(e[2] for e in shards[-1]) + entry[2] > max_shard_bytes:
            shards.append([])
        shards[-1].append(entry)
    dest.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = HF_WEIGHTS if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for s, name, _ in shard:
            t = stage_files[s].get_tensor(name)
            heads = _rotary_heads(name, cfg)
            tensors[hf_name(name)] = (pairs_to_halves(t, heads) if heads else t).contiguous()
            weight_map[hf_name(name)] = fname
        save_file(tensors, str(dest / fname), metadata={"format": "pt"})
        written.append(fname)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(e[2] for e in plan)}, "weight_map": weight_map}
        write_durable(dest / HF_INDEX, json.dumps(index, indent=2).encode())
        written.append(HF_INDEX)
    bos, eos = _export_tokenizer(step, manifest, dest, written)
    dtype = str(FLOAT_DTYPES[dtypes.pop()] if len(dtypes) == 1 else torch.float32).removeprefix("torch.")
    write_durable(dest / HF_CONFIG, json.dumps(hf_config(cfg, bos, eos, dtype), indent=2).encode())
    write_durable(dest / "generation_config.json",
           json.dumps({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}, indent=2).encode())
    written += [HF_CONFIG, "generation_config.json"]
    return ExportResult(tuple(written), cfg, cfg.num_params())


def _export_tokenizer(step: Path, manifest: dict[str, Any], dest: Path, written: list[str]
                      ) -> tuple[int | None, int | None]:
    """Copy the checkpoint's tokenizer (writing a tokenizer_config.json when it has none); its (bos, eos) ids."""
    if HF_TOKENIZER not in manifest["files"]:
        return None, None
    src = step / HF_TOKENIZER
    try:
        tok = read_tokenizer_file(src)
        eos = end_of_text_id(tok, src)
        bos_token = special_token(src, "bos_token")
    except ValueError as e:
        raise HFFormatError(str(e)) from None
    bos = None if bos_token is None else tok.token_to_id(bos_token)
    shutil.copyfile(src, dest / HF_TOKENIZER)
    if TOKENIZER_CONFIG in manifest["files"]:
        shutil.copyfile(step / TOKENIZER_CONFIG, dest / TOKENIZER_CONFIG)
    else:  # one of skippipe's own tokenizers: `<eos>` ends documents, `<pad>` pads
        names = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": tok.id_to_token(eos), "bos_token": None}
        if tok.token_to_id("<pad>") is not None:
            names["pad_token"] = "<pad>"
        write_durable(dest / TOKENIZER_CONFIG, json.dumps(names, indent=1).encode())
    written += [HF_TOKENIZER, TOKENIZER_CONFIG]
    return bos, eos


def hf_config(cfg: ModelConfig, bos: int | None, eos: int | None, dtype: str) -> dict[str, Any]:
    """A LlamaForCausalLM config.json for `cfg` (readable by transformers 4 and 5)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": bos, "eos_token_id": eos,
        "torch_dtype": dtype, "use_cache": True,
    }
