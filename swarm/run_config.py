"""`RunConfig`: everything a run is, loaded from TOML, published by the coordinator as the run spec.

Precedence is CLI > TOML > defaults. Peers rebuild the same config from the signed run spec, as data:
unknown or mistyped fields are refused with a message naming the field.

```toml
[run]
run_id = "demo"
model = "tiny"          # a flavor of peers.model.FLAVORS (or a [model] table, below)
stages = 3
skip = 0.33
microbatches = 4        # per data holder per iteration
memory = 3              # activations a peer may hold awaiting backward
iterations = 30         # 0 = until stopped
seed = 0
min_peers = 6           # the coordinator plans once this many peers have announced themselves
init_from = ""          # start from this checkpoint's weights (e.g. import-hf's output): its model, its stages
                        # and its tokenizer unless given; optimizer fresh, iteration 0

# [model]               # instead of run.model: an explicit architecture (peers.model.ModelConfig fields), as
                        # import-hf writes it in its run.toml; sizes are checked against MODEL_LIMITS
[optim]                 # peers.optim.OptimConfig fields
lr = 0.003

[data]                  # peers.data.DataConfig fields
seq_len = 64
batch_size = 8

[train]                 # peers.train_config.TrainConfig fields
precision = "auto"      # auto (bf16 on a GPU with native bf16, else fp32) / fp32 / bf16 / fp16
recompute = "auto"      # blocks / none; auto = blocks for the 500m and 1.5b flavors

[swarm]
wire_dtype = "float32"  # or float16 / bfloat16 on the wire
average_dtype = "float32"  # or bfloat16: stage gradients on the wire at half the bytes
profile = ""            # plan on a network preset instead of the measured links (studies, emulation)
planner = "skippipe"    # or skippipe-no-collision / full-pipeline / random-skip / swarm (baselines, for benchmarks)
rebalance = true        # a survivor may move to a stage group a departure left the bottleneck
holder_shares = true    # a data holder the commits show slow is given fewer microbatches, then benched
measured_speeds = false # plan on the speeds the peers' passes run at, not those they announced
link_drift = true       # re-plan the paths when a link they cross drifts from what they were planned on
bench_seconds = 300     # how long a peer slow for good sits out (doubled each time; 0 = never)
message_bytes = 0       # emulation: pad each activation and gradient to this many bytes (0 = their own size)
chunk_bytes = 67108864  # stage gradients and state larger than this travel in pieces of this size (64 MiB)
```
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from peers.checkpoint import initial_weight_digests, resolve_checkpoint
from peers.data import DataConfig
from peers.model import FLAVORS, ModelConfig
from peers.optim import OptimConfig
from peers.precision import run_loss_scale
from peers.stage import balanced_split
from peers.train_config import TrainConfig
from scheduler.constants import DEFAULT_MEMORY_SLOTS
from scheduler.path_rules import never_trained_stages
from swarm.constants import CHUNK_BYTES, MAX_TENSOR_BYTES, MIN_CHUNK_BYTES
from swarm.coordinator.benches import BENCH
from swarm.wire import RunSpec

WireDtype = Literal["float32", "float16", "bfloat16"]
Averaging = Literal["allgather", "parts", "hivemind"]
AverageDtype = Literal["float32", "bfloat16"]
Planner = Literal["skippipe", "skippipe-no-collision", "full-pipeline", "random-skip", "swarm"]
PLANNERS: tuple[str, ...] = ("skippipe", "skippipe-no-collision", "full-pipeline", "random-skip", "swarm")
FULL_PATH_PLANNERS = ("full-pipeline", "swarm")
"""Planners whose microbatches visit every stage (`run.skip` does not apply to them)."""
CUSTOM_MODEL = "custom"
"""`run.model` of a run whose architecture is a [model] table (or an init_from checkpoint's), not a flavor."""
MODEL_LIMITS = {"vocab_size": 1 << 21, "dim": 1 << 16, "n_layers": 1024, "n_heads": 1024, "ffn_dim": 1 << 18,
                "max_seq_len": 1 << 20}
"""Largest explicit model sizes accepted (a run spec is untrusted: a peer must not allocate whatever it says)."""
MAX_MODEL_PARAMS = 2 * 10**12
WIRE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per element of each wire dtype."""
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Largest `message_bytes` accepted (a run spec is untrusted: every peer would allocate and send it)."""


@dataclass(frozen=True)
class RunConfig:
    run_id: str = "skippipe"
    """Names the run's DHT keys and gossip topics; peers of other runs are refused."""
    model: str = "tiny"
    """Model flavor (peers.model.FLAVORS), or "custom" for `architecture`."""
    stages: int = 3
    """Pipeline stages S."""
    skip: float = 0.33
    """Skip ratio k = 1 - R/S (0 = full pipeline)."""
    microbatches: int = 4
    """Microbatches each data holder injects per iteration."""
    memory: int = DEFAULT_MEMORY_SLOTS
    """Activations a peer may hold awaiting backward (TC1)."""
    iterations: int = 0
    """Iterations to train; 0 = until stopped."""
    seed: int = 0
    """Seeds weights (the same on every peer), planning and data order."""
    min_peers: int = 2
    """Peers the coordinator waits for before planning the first schedule."""
    wire_dtype: WireDtype = "float32"
    """dtype of activations and gradients on the wire."""
    profile: str = ""
    """Plan on this network preset or profile file instead of measured links ("" = measured)."""
    planner: Planner = "skippipe"
    """How paths are chosen: SkipPipe (with or without collision awareness), or a baseline on the same placement:
    the DT-FM full pipeline (every stage in order, columns tuned on the simulator), network-oblivious random skip, or
    SWARM-style stochastic wiring (`swarm`: every stage in order, each hop's peer drawn in proportion to its
    throughput, peers rebalanced toward the bottleneck stage at each re-plan; the wiring is drawn per epoch)."""
    rebalance: bool = True
    """After a departure, move a survivor into a stage group it shrank when that shortens the planned iteration by
    `REBALANCE_MIN_GAIN` or more, state transfer included (false: survivors keep their stages until a peer joins)."""
    holder_shares: bool = True
    """A data holder left out of commits for being late in two of its last three iterations is given half its
    microbatches by a re-plan, and its share back once on time again (`swarm.coordinator.holder_shares`); one still
    late at its smallest share is benched (`swarm.coordinator.benches`); false: every holder injects `microbatches`
    per shard whatever its pace, and stays (the others then wait for a slow one every third iteration)."""
    measured_speeds: bool = False
    """Plan on each peer's speed as its reported passes show it (its announced seconds per layer times its measured
    slowdown), and re-plan the paths when one drifts from what its epoch assumed where that pays
    (`swarm.coordinator.measured_speeds`); false: every plan takes the speeds the peers announced. Off by default:
    with real compute of a small model the passes' fixed costs, which the per-layer cost model leaves out, made the
    absolute slowdowns 2-30x and drift re-plans fire every few iterations (CI's local swarms, 2026-12-06); each is now
    taken relative to its kind's (holders', relays'), which removes what all share, but that has not been run at 20
    peers under churn yet. On at the emulated speeds of `benchmarks/drifted_speed.py`."""
    link_drift: bool = True
    """Re-plan the paths on the same placement when a link they cross measures 1.5x off what they were planned on,
    where the new paths simulate 5% quicker (`swarm.coordinator.link_drift`); false: paths change with membership
    only (a benchmark's baseline)."""
    bench_seconds: float = BENCH
    """How long a peer slow for good (a holder still late at its smallest share, a relay whose passes stay far slower
    than the other relays') sits out the first time (doubled each time it is benched again, up to `MAX_BENCH` or
    this, whichever is longer), then is placed again; 0: never benched: a holder stays at its smallest share, a relay
    keeps its work (`swarm.coordinator.benches`, `swarm.coordinator.slow_peers`)."""
    message_bytes: int = 0
    """Emulation: pad every activation and gradient on the wire with zero rows (along the batch) to at least this
    many bytes, so a small model's run carries a bigger model's messages (`wire_activation_shape`); the planner's
    cost tables and the peers' link probes use the same size. 0 = the messages' own size."""
    chunk_bytes: int = CHUNK_BYTES
    """Stage-group messages (a stage's gradients, its state for a joiner) larger than this travel in pieces of at
    most this size (`swarm.peer.message_chunks`): smaller pieces for slower links, each within one message's
    deadline."""
    heartbeat: float = 2.0
    """Seconds between a peer's record refreshes; a record expires after three missed ones (failure detection)."""
    average_dtype: AverageDtype = "float32"
    """dtype of stage gradients on the wire (all-gather and by parts): bfloat16 halves their bytes (each member rounds
    its own contribution the same way, so the members' means stay bit-identical), at 8 bits of mantissa per gradient
    element, as DDP's bf16 compression hook. float16 is not offered: gradient sums overflow it."""
    averaging: Averaging = "allgather"
    """Stage-group averaging: all-gather over the tensor transport (exact, one round trip; each member sends its
    gradient to every other), by parts over the tensor transport (`swarm.stage_group.parts_round`: a reduce-scatter
    with two owners per part, then the parts' means to everyone; robust per part, 4 (n - 1) / n gradients a member
    instead of n - 1, in groups of five or more: for slow links, not for hosts where message latency dominates),
    or hivemind's DecentralizedAverager (butterfly all-reduce, not robust to a faulty member; one that stops
    mid-round leaves its part unaveraged, and the copies then drift apart slightly)."""
    checkpoint_every: int = 0
    """Iterations between a peer's own checkpoints (0 = never); written where the peer's --checkpoint-dir says."""
    architecture: ModelConfig | None = None
    """The exact model, from a [model] table or `init_from`'s checkpoint (None: the flavor `model`, its vocabulary
    the tokenizer's). `model` then names the flavor it matches, or "custom"."""
    init_from: str = ""
    """Start from this whole-model checkpoint's weights (weights only: optimizer fresh, iteration 0). A path where
    the coordinator runs; each peer points its own --init-from at a copy ("" = weights from the seed)."""
    init_weights: tuple[str, ...] = ()
    """SHA-256 of each stage's weights file of `init_from` (set from it, carried in the run spec: a peer whose
    --init-from files differ is refused)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-3))
    """AdamW and its schedule (the default suits the tiny model)."""
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    """Precision and activation recomputation of every stage."""

    def validate(self) -> None:
        """Raise ValueError naming the field that is wrong."""
        if not isinstance(self.run_id, str) or not self.run_id or len(self.run_id) > 64 or "/" in self.run_id:
            raise ValueError(f"run.run_id must be 1-64 characters without '/', got {self.run_id!r}")
        self._validate_model()
        base = self.base_model
        for name, lo in (("stages", 1), ("microbatches", 1), ("memory", 1), ("iterations", 0), ("min_peers", 1),
                         ("checkpoint_every", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise ValueError(f"run.{name} must be an integer >= {lo}, got {value!r}")
        if self.stages > base.n_layers:
            raise ValueError(f"run.stages: {self.model} has {base.n_layers} layers, so at most that many stages")
        if isinstance(self.skip, bool) or not isinstance(self.skip, (int, float)) or not 0 <= self.skip < 1:
            raise ValueError(f"run.skip must be in [0, 1), got {self.skip!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"run.seed must be an integer, got {self.seed!r}")
        if self.wire_dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"swarm.wire_dtype must be float32, float16 or bfloat16, got {self.wire_dtype!r}")
        if isinstance(self.message_bytes, bool) or not isinstance(self.message_bytes, int) or \
                not 0 <= self.message_bytes <= MAX_MESSAGE_BYTES:
            raise ValueError(f"swarm.message_bytes must be an integer in [0, {MAX_MESSAGE_BYTES}], got "
                             f"{self.message_bytes!r}")
        if isinstance(self.chunk_bytes, bool) or not isinstance(self.chunk_bytes, int) or \
                not MIN_CHUNK_BYTES <= self.chunk_bytes <= MAX_TENSOR_BYTES:
            raise ValueError(f"swarm.chunk_bytes must be an integer in [{MIN_CHUNK_BYTES}, {MAX_TENSOR_BYTES}], got "
                             f"{self.chunk_bytes!r}")
        if isinstance(self.heartbeat, bool) or not isinstance(self.heartbeat, (int, float)) or \
                not 0.2 <= self.heartbeat <= 60:
            raise ValueError(f"swarm.heartbeat must be 0.2-60 seconds, got {self.heartbeat!r}")
        if self.planner not in PLANNERS:
            raise ValueError(f"swarm.planner must be one of {', '.join(PLANNERS)}, got {self.planner!r}")
        never = never_trained_stages(self.stages, self.skip) if self.planner not in FULL_PATH_PLANNERS else []
        if never:
            raise ValueError(f"run.skip {self.skip} with {self.stages} stages: no path can visit stage(s) "
                             f"{', '.join(map(str, never))}, whose peers would never train; lower run.skip or "
                             "run.stages")
        for name in ("rebalance", "holder_shares", "measured_speeds", "link_drift"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"swarm.{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.bench_seconds, bool) or not isinstance(self.bench_seconds, (int, float)) or \
                not 0 <= self.bench_seconds <= 86400:
            raise ValueError(f"swarm.bench_seconds must be 0-86400 seconds, got {self.bench_seconds!r}")
        if self.average_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"swarm.average_dtype must be float32 or bfloat16, got {self.average_dtype!r}")
        if self.averaging not in ("allgather", "parts", "hivemind"):
            raise ValueError(f"swarm.averaging must be allgather, parts or hivemind, got {self.averaging!r}")
        if not isinstance(self.profile, str):
            raise ValueError("swarm.profile must be a string")
        self.optim.validate()
        self.data.validate()
        if not isinstance(self.train, TrainConfig):
            raise ValueError("[train] must be a table")
        self.train.validate()
        if self.data.seq_len > base.max_seq_len:
            raise ValueError(f"data.seq_len: {self.model} takes at most {base.max_seq_len} tokens")
        if not isinstance(self.init_from, str):
            raise ValueError("run.init_from must be a checkpoint directory path")
        digests = self.init_weights
        if not isinstance(digests, tuple) or (digests and len(digests) != self.stages) or not all(
                isinstance(d, str) and len(d) == 64 and all(c in "0123456789abcdef" for c in d) for d in digests):
            raise ValueError(f"run.init_weights must be one SHA-256 (hex) per stage ({self.stages}), got {digests!r}")

    def _validate_model(self) -> None:
        arch = self.architecture
        if arch is None:
            if self.model not in FLAVORS:
                raise ValueError(f"run.model must be one of {', '.join(FLAVORS)} (or give a [model] table), got "
                                 f"{self.model!r}")
            return
        if not isinstance(arch, ModelConfig):
            raise ValueError("[model] must be a table of model config fields")
        arch.validate()
        for name, limit in MODEL_LIMITS.items():
            if getattr(arch, name) > limit:
                raise ValueError(f"model.{name}={getattr(arch, name)} is larger than this build accepts ({limit})")
        if arch.num_params() > MAX_MODEL_PARAMS:
            raise ValueError(f"[model] has {arch.num_params():.3g} parameters, more than {MAX_MODEL_PARAMS:.3g}")
        if self.model != CUSTOM_MODEL and (self.model not in FLAVORS or dataclasses.replace(
                arch, vocab_size=FLAVORS[self.model].vocab_size) != FLAVORS[self.model]):
            raise ValueError(f"run.model {self.model!r} is not the model the [model] table (or the checkpoint, or the "
                             f"run spec) describes: give one of them")

    @property
    def base_model(self) -> ModelConfig:
        """The model's shape (its vocabulary is the tokenizer's for a flavor: `model_config`)."""
        return self.architecture if self.architecture is not None else FLAVORS[self.model]

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The run's model for a tokenizer of `vocab_size` tokens: a flavor takes that vocabulary; an explicit
        architecture keeps its own, which must hold every token (an imported model's is often padded larger).

        :raises ValueError: the tokenizer has more tokens than the architecture's vocabulary
        """
        if self.architecture is None:
            return dataclasses.replace(FLAVORS[self.model], vocab_size=vocab_size)
        if vocab_size > self.architecture.vocab_size:
            raise ValueError(f"the tokenizer has {vocab_size} tokens, more than model.vocab_size "
                             f"{self.architecture.vocab_size}: use the model's own tokenizer (data.tokenizer)")
        return self.architecture

    @property
    def recompute(self) -> bool:
        """Whether every stage recomputes its blocks' activations in the backward (`train.recompute`)."""
        return self.train.recompute_blocks(self.model)

    def wire_activation_shape(self, dim: int) -> tuple[int, int, int]:
        """Shape of every activation and gradient on the wire for a model of width `dim`: (batch_size, seq_len,
        dim), its batch padded with zero rows up to `message_bytes` where that is larger (emulation)."""
        row = self.data.seq_len * dim * WIRE_BYTES[self.wire_dtype]
        return (max(self.data.batch_size, -(-self.message_bytes // row)), self.data.seq_len, dim)

    def message_size(self, dim: int) -> int:
        """Bytes of one activation (or gradient) on the wire, padding included: what the planner costs."""
        rows, seq_len, dim = self.wire_activation_shape(dim)
        return rows * seq_len * dim * WIRE_BYTES[self.wire_dtype]

    @property
    def loss_scale(self) -> float:
        """What every data holder multiplies its loss by and every stage divides its gradient by (fp16 runs)."""
        return run_loss_scale(self.train.precision, self.train.loss_scale)

    # ---- TOML ----------------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> RunConfig:
        """Read a run.toml; `overrides` (CLI flags, None = not given) win over the file."""
        try:
            raw = tomllib.loads(Path(path).read_text())
        except OSError as e:
            raise ValueError(f"cannot read config {path}: {e}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"config {path} is not valid TOML: {e}") from None
        return cls.from_tables(raw, **overrides)

    @classmethod
    def from_tables(cls, raw: Any, **overrides: Any) -> RunConfig:
        if not isinstance(raw, dict):
            raise ValueError("config must be a table")
        unknown = set(raw) - {"run", "optim", "data", "swarm", "train", "model"}
        if unknown:
            raise ValueError(f"unknown config section(s): {', '.join(sorted(unknown))}")
        flat: dict[str, Any] = {}
        own = {f.name for f in fields(cls)} - {"optim", "data", "train", "architecture", "init_weights"}
        for section in ("run", "swarm"):
            table = raw.get(section, {})
            if not isinstance(table, dict):
                raise ValueError(f"[{section}] must be a table")
            for key, value in table.items():
                if key not in own:
                    raise ValueError(f"unknown field {section}.{key}")
                flat[key] = value
        flat.update({k: v for k, v in overrides.items() if v is not None})
        table = raw.get("optim", {})
        if not isinstance(table, dict):
            raise ValueError("[optim] must be a table")
        optim = OptimConfig.from_dict({"lr": cls().optim.lr, **table})
        data = DataConfig.from_dict(raw.get("data", {}))
        train = TrainConfig.from_dict(raw.get("train", {}))
        if "model" in raw:
            if "model" in flat:
                raise ValueError("run.model and a [model] table both name the model: keep one")
            flat["model"], flat["architecture"] = CUSTOM_MODEL, ModelConfig.from_dict(raw["model"])
        if flat.get("init_from"):
            flat, data = _from_checkpoint(flat, data)
        if "iterations" in flat and "optim" not in raw:
            optim = dataclasses.replace(optim, total_steps=max(1, flat["iterations"] or optim.total_steps),
                                        warmup_steps=max(1, min(optim.warmup_steps, (flat["iterations"] or 20) // 10)))
        cfg = cls(**flat, optim=optim, data=data, train=train)
        cfg.validate()
        return cfg

    # ---- the run spec the coordinator signs ----------------------------------------------------
    def to_spec(self, *, coordinator: str, vocab_size: int, control_addrs: tuple[str, ...] = ()) -> RunSpec:
        hyper = {k: getattr(self, k) for k in ("microbatches", "memory", "iterations", "seed", "min_peers",
                                               "wire_dtype", "profile", "model", "checkpoint_every",
                                               "averaging", "heartbeat", "planner", "rebalance")}
        if self.message_bytes:  # a spec without it stays readable by peers that predate it
            hyper["message_bytes"] = self.message_bytes
        if self.chunk_bytes != CHUNK_BYTES:  # likewise
            hyper["chunk_bytes"] = self.chunk_bytes
        if self.average_dtype != "float32":  # likewise
            hyper["average_dtype"] = self.average_dtype
        if not self.holder_shares:  # likewise
            hyper["holder_shares"] = False
        if self.measured_speeds:  # likewise
            hyper["measured_speeds"] = True
        if not self.link_drift:  # likewise
            hyper["link_drift"] = False
        if self.bench_seconds != BENCH:  # likewise
            hyper["bench_seconds"] = float(self.bench_seconds)
        hyper["init_weights"] = list(self.init_weights)
        hyper["optim"] = dataclasses.asdict(self.optim)
        hyper["train"] = self.train.to_dict()
        return RunSpec(run_id=self.run_id, model=self.model_config(vocab_size).to_dict(), stages=self.stages,
                       skip_ratio=float(self.skip), hyperparameters=hyper, data=self.data.to_dict(),
                       coordinator=coordinator, control_addrs=control_addrs)

    @classmethod
    def from_spec(cls, spec: RunSpec) -> tuple[RunConfig, ModelConfig]:
        """The config and exact model a signed run spec describes (untrusted data: checked field by field)."""
        hyper = dict(spec.hyperparameters)
        optim = OptimConfig.from_dict(hyper.pop("optim", {}))
        train = TrainConfig.from_dict(hyper.pop("train", {}))
        own = {f.name for f in fields(cls)} - {"optim", "data", "train", "run_id", "stages", "skip", "architecture",
                                               "init_from"}
        unknown = set(hyper) - own
        if unknown:
            raise ValueError(f"run spec has unknown hyperparameter(s): {', '.join(sorted(unknown))}")
        digests = hyper.pop("init_weights", [])
        if not isinstance(digests, list):
            raise ValueError("run spec init_weights must be a list")
        model = ModelConfig.from_dict(spec.model)
        cfg = cls(run_id=spec.run_id, stages=spec.stages, skip=spec.skip_ratio, optim=optim,
                  data=DataConfig.from_dict(spec.data), train=train, architecture=model, init_weights=tuple(digests),
                  **hyper)
        try:
            cfg.validate()
        except ValueError as e:
            raise ValueError(f"run spec: {e}") from None
        return cfg, model


def _from_checkpoint(flat: dict[str, Any], data: DataConfig) -> tuple[dict[str, Any], DataConfig]:
    """`flat` (the [run] and [swarm] fields) completed from checkpoint `flat["init_from"]`: its model, stages and
    tokenizer where the config gives none, and its stage files' digests; a model or split it does not hold is
    refused."""
    path = flat["init_from"]
    if not isinstance(path, str):
        raise ValueError("run.init_from must be a checkpoint directory path")
    try:
        step, manifest = resolve_checkpoint(path)
        saved = ModelConfig.from_dict(manifest["model"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"run.init_from {path}: {e}") from None
    flat = dict(flat)
    if "architecture" not in flat:
        flat["architecture"] = saved
        flat.setdefault("model", CUSTOM_MODEL)
    flat.setdefault("stages", len(manifest["split"]))
    if data.tokenizer is None and "tokenizer.json" in manifest["files"]:
        data = dataclasses.replace(data, tokenizer=str(step / "tokenizer.json"))
    arch = flat["architecture"]
    if not isinstance(flat["stages"], int) or not 1 <= flat["stages"] <= arch.n_layers:
        raise ValueError(f"run.stages must be 1-{arch.n_layers} for this model, got {flat['stages']!r}")
    try:
        flat["init_weights"] = initial_weight_digests(path, arch, balanced_split(arch.n_layers, flat["stages"]))
    except ValueError as e:
        raise ValueError(f"run.init_from {path}: {e}") from None
    return flat, data

