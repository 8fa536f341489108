"""`RunConfig`: everything a run is, loaded from TOML, published by the coordinator as the run spec.

Precedence is CLI > TOML > defaults. Peers rebuild the same config from the signed run spec, as data:
unknown or mistyped fields are refused with a message naming the field.

```toml
[run]
run_id = "demo"
model = "tiny"          # a flavor of peers.model.FLAVORS
stages = 3
skip = 0.33
microbatches = 4        # per data holder per iteration
memory = 3              # activations a peer may hold awaiting backward
iterations = 30         # 0 = until stopped
seed = 0
min_peers = 6           # the coordinator plans once this many peers have announced themselves

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
profile = ""            # plan on a network preset instead of the measured links (studies, emulation)
planner = "skippipe"    # or skippipe-no-collision / full-pipeline / random-skip (baselines, for benchmarks)
rebalance = true        # a survivor may move to a stage group a departure left the bottleneck
```
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from peers.data import DataConfig
from peers.model import FLAVORS, ModelConfig
from peers.optim import OptimConfig
from peers.precision import run_loss_scale
from peers.train_config import TrainConfig
from scheduler.constants import DEFAULT_MEMORY_SLOTS
from scheduler.path_rules import PathRules
from swarm.wire import RunSpec

WireDtype = Literal["float32", "float16", "bfloat16"]
Averaging = Literal["allgather", "hivemind"]
Planner = Literal["skippipe", "skippipe-no-collision", "full-pipeline", "random-skip"]
PLANNERS: tuple[str, ...] = ("skippipe", "skippipe-no-collision", "full-pipeline", "random-skip")


def never_trained_stages(stages: int, skip: float) -> list[int]:
    """The stages no valid path can visit with `skip` (R = round((1 - skip) * S) stages per path): a path makes
    R - 1 hops past stage 0, each at most `max_jump` stages above the highest so far, so it reaches no stage above
    (R - 1) * max_jump, and with R = 1 none at all. Peers placed there would receive nothing for the whole run."""
    rules = PathRules.from_skip_ratio(stages, skip)
    return list(range(rules.hops * rules.max_jump + 1, stages))


@dataclass(frozen=True)
class RunConfig:
    run_id: str = "skippipe"
    """Names the run's DHT keys and gossip topics; peers of other runs are refused."""
    model: str = "tiny"
    """Model flavor (peers.model.FLAVORS)."""
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
    the DT-FM full pipeline (every stage in order, columns tuned on the simulator) or network-oblivious random skip."""
    rebalance: bool = True
    """After a departure, move a survivor into a stage group it shrank when that shortens the planned iteration by
    `REBALANCE_MIN_GAIN` or more, state transfer included (false: survivors keep their stages until a peer joins)."""
    heartbeat: float = 2.0
    """Seconds between a peer's record refreshes; a record expires after three missed ones (failure detection)."""
    averaging: Averaging = "allgather"
    """Stage-group averaging: all-gather over the tensor transport (exact, one round trip, for small groups)
    or hivemind's DecentralizedAverager (butterfly all-reduce, for large groups and models)."""
    checkpoint_every: int = 0
    """Iterations between a peer's own checkpoints (0 = never); written where the peer's --checkpoint-dir says."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=3e-3))
    """AdamW and its schedule (the default suits the tiny model)."""
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    """Precision and activation recomputation of every stage."""

    def validate(self) -> None:
        """Raise ValueError naming the field that is wrong."""
        if not isinstance(self.run_id, str) or not self.run_id or len(self.run_id) > 64 or "/" in self.run_id:
            raise ValueError(f"run.run_id must be 1-64 characters without '/', got {self.run_id!r}")
        if self.model not in FLAVORS:
            raise ValueError(f"run.model must be one of {', '.join(FLAVORS)}, got {self.model!r}")
        for name, lo in (("stages", 1), ("microbatches", 1), ("memory", 1), ("iterations", 0), ("min_peers", 1),
                         ("checkpoint_every", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise ValueError(f"run.{name} must be an integer >= {lo}, got {value!r}")
        if self.stages > FLAVORS[self.model].n_layers:
            raise ValueError(f"run.stages: {self.model} has {FLAVORS[self.model].n_layers} layers, so at most that "
                             "many stages")
        if isinstance(self.skip, bool) or not isinstance(self.skip, (int, float)) or not 0 <= self.skip < 1:
            raise ValueError(f"run.skip must be in [0, 1), got {self.skip!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"run.seed must be an integer, got {self.seed!r}")
        if self.wire_dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"swarm.wire_dtype must be float32, float16 or bfloat16, got {self.wire_dtype!r}")
        if isinstance(self.heartbeat, bool) or not isinstance(self.heartbeat, (int, float)) or \
                not 0.2 <= self.heartbeat <= 60:
            raise ValueError(f"swarm.heartbeat must be 0.2-60 seconds, got {self.heartbeat!r}")
        if self.planner not in PLANNERS:
            raise ValueError(f"swarm.planner must be one of {', '.join(PLANNERS)}, got {self.planner!r}")
        never = never_trained_stages(self.stages, self.skip) if self.planner != "full-pipeline" else []
        if never:
            raise ValueError(f"run.skip {self.skip} with {self.stages} stages: no path can visit stage(s) "
                             f"{', '.join(map(str, never))}, whose peers would never train; lower run.skip or "
                             "run.stages")
        if not isinstance(self.rebalance, bool):
            raise ValueError(f"swarm.rebalance must be true or false, got {self.rebalance!r}")
        if self.averaging not in ("allgather", "hivemind"):
            raise ValueError(f"swarm.averaging must be allgather or hivemind, got {self.averaging!r}")
        if not isinstance(self.profile, str):
            raise ValueError("swarm.profile must be a string")
        self.optim.validate()
        self.data.validate()
        if not isinstance(self.train, TrainConfig):
            raise ValueError("[train] must be a table")
        self.train.validate()
        if self.data.seq_len > FLAVORS[self.model].max_seq_len:
            raise ValueError(f"data.seq_len: {self.model} takes at most {FLAVORS[self.model].max_seq_len} tokens")

    def model_config(self, vocab_size: int) -> ModelConfig:
        return dataclasses.replace(FLAVORS[self.model], vocab_size=vocab_size)

    @property
    def recompute(self) -> bool:
        """Whether every stage recomputes its blocks' activations in the backward (`train.recompute`)."""
        return self.train.recompute_blocks(self.model)

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
        unknown = set(raw) - {"run", "optim", "data", "swarm", "train"}
        if unknown:
            raise ValueError(f"unknown config section(s): {', '.join(sorted(unknown))}")
        flat: dict[str, Any] = {}
        own = {f.name for f in fields(cls)} - {"optim", "data", "train"}
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
        own = {f.name for f in fields(cls)} - {"optim", "data", "train", "run_id", "stages", "skip"}
        unknown = set(hyper) - own
        if unknown:
            raise ValueError(f"run spec has unknown hyperparameter(s): {', '.join(sorted(unknown))}")
        cfg = cls(run_id=spec.run_id, stages=spec.stages, skip=spec.skip_ratio, optim=optim,
                  data=DataConfig.from_dict(spec.data), train=train, **hyper)
        cfg.validate()
        model = ModelConfig.from_dict(spec.model)
        expected = FLAVORS[cfg.model]
        if dataclasses.replace(model, vocab_size=expected.vocab_size) != expected:
            raise ValueError(f"run spec model does not match flavor {cfg.model}")
        return cfg, model

