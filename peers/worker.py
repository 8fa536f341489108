"""`StageWorker`: what one peer computes for the microbatches that pass through its stage.

Contract (the in-process swarm and the networked runtime call exactly these methods):

- stage 0 (a data holder): `inject(mb, tokens) -> activation` embeds a microbatch and runs stage 0's
  blocks; `loss(mb, activation) -> (loss, grad)` when it comes back; `backward(mb, grad)` ends it.
- stages 1..S-1: `forward(mb, activation) -> activation`, later `backward(mb, grad) -> grad`.
- Microbatches arrive in any order and at any path position; each is stashed from its forward until
  its backward, and at most `memory_slots` may be stashed at once (TC1): one more is refused with
  `MemoryLimitError`, nothing is queued silently.
- Gradients accumulate as sums with a count of the microbatches that actually completed their
  backward here (`visits`). A microbatch run again after a peer on its path died (a re-queue) passes
  `accumulate=False` where its gradient is already in the sum: only the gradient for the previous hop is
  computed, so no stage counts it twice. `step()` divides by that count, or the caller first installs the
  stage group's visit-weighted mean with `set_mean_gradients` (in-process: `peers.averaging`;
  networked: the stage group's all-reduce). Exactly one optimizer step per `step()`.
- Under an fp16 run the data holder's loss is multiplied by the run's loss scale; the first of
  `gradient_sums()`/`step()` divides the accumulated gradient by it, and drops it if it overflowed (visits 0:
  the stage group averages without it, every member takes the same step; see `peers.precision`).
- With `recompute`, a stashed microbatch keeps only its blocks' inputs; the blocks run again in its backward.
- Every argument is checked before any state changes: a bad call raises `WorkerError` naming the
  problem and the worker stays usable.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from peers.model import ModelConfig, Transformer, lm_loss
from peers.optim import OptimConfig, build_optimizer, lr_at
from peers.precision import DEFAULT_LOSS_SCALE, Precision, autocast, check_loss_scale, scaled_loss, unscale_gradients
from peers.stage import build_stage, check_split
from scheduler.constants import DEFAULT_MEMORY_SLOTS

logger = logging.getLogger(__name__)

MAX_MICROBATCH_SAMPLES = 4096
"""Largest batch dimension a worker accepts in one activation."""


class WorkerError(ValueError):
    """A call the worker refuses (bad tensor, unknown microbatch, wrong stage); the worker stays usable."""


class MemoryLimitError(WorkerError):
    """Accepting one more microbatch would exceed the worker's memory slots (TC1)."""


@dataclass
class _Stash:
    inputs: torch.Tensor
    """Stage 0: token ids (B, T); other stages: the received activation, a leaf that requires grad."""
    output: torch.Tensor
    """The activation sent on, still attached to its graph."""
    targets: torch.Tensor | None = None
    """Stage 0 only: next-token targets (B, T)."""


@dataclass(frozen=True)
class StepStats:
    step: int
    """Optimizer steps taken so far, this one included."""
    lr: float
    grad_norm: float
    """Norm of the stage's mean gradient before clipping (nan when the step was skipped)."""
    visits: int
    """Microbatches whose gradient this step used (the stage group's total when averaged)."""
    skipped: bool = False
    """True when the gradient was not finite and no update was made (fp16 overflow)."""


class StageWorker:
    """Forward and backward of one stage for microbatches in any order, gradient accounting, AdamW.

    :param peer_id: the peer this worker runs on (only used in messages)
    :param stage: the stage it serves; 0 makes it a data holder
    :param split: decoder layers per stage
    :param memory_slots: activations it may hold awaiting backward (the reference's m)
    :param dtype: parameter and activation dtype (float64 for exactness tests)
    :param precision: autocast for the compute ("bf16"/"fp16" on CUDA; "fp32" is plain); which precision a
      device may use is `peers.precision.resolve_precision`'s call, not the worker's
    :param seed: weight-initialisation seed, the same on every peer of a run
    :param recompute: recompute each block's activations in the backward (`Transformer.recompute`)
    :param loss_scale: the run's loss scale (`peers.precision.run_loss_scale`), the same on every peer of a run;
      None: `DEFAULT_LOSS_SCALE` under fp16, else 1
    """

    def __init__(self, peer_id: str, stage: int, cfg: ModelConfig, split: Sequence[int], optim: OptimConfig, *,
                 memory_slots: int = DEFAULT_MEMORY_SLOTS, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, precision: Precision = "fp32", seed: int = 0,
                 recompute: bool = False, loss_scale: float | None = None) -> None:
        self.split = check_split(split, cfg.n_layers)
        if not 0 <= stage < len(self.split):
            raise ValueError(f"stage {stage} outside 0..{len(self.split) - 1}")
        if memory_slots < 1:
            raise ValueError(f"memory_slots must be >= 1, got {memory_slots}")
        if precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
        self.peer_id, self.stage, self.config, self.optim_config = peer_id, stage, cfg, optim
        self.memory_slots, self.precision = memory_slots, precision
        self.loss_scale = check_loss_scale(loss_scale, "loss_scale") if loss_scale is not None else \
            (DEFAULT_LOSS_SCALE if precision == "fp16" else 1.0)
        """What the data holder multiplies its loss by, and every stage divides its gradient by."""
        self.device, self.dtype = torch.device(device), dtype
        self.module: Transformer = build_stage(cfg, self.split, stage, seed=seed, recompute=recompute).to(
            self.device, dtype)
        self.optimizer = build_optimizer(self.module, optim)
        self.steps = 0
        """Optimizer steps taken (one per iteration)."""
        self.visits = 0
        """Microbatches whose backward completed here since the last step."""
        self._stash: dict[int, _Stash] = {}
        self._learnt: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """Stages 1..S-1: microbatch whose gradient is in the sum -> (its input, the gradient it brought back), kept
        until the step so that it can be taken out again (`unlearn`)."""
        self._mean_installed: int | None = None
        self._unscaled = False

    # ---- properties -------------------------------------------------------------------------
    @property
    def is_data_holder(self) -> bool:
        return self.stage == 0

    @property
    def stashed(self) -> list[int]:
        """Microbatches awaiting their backward here."""
        return list(self._stash)

    @property
    def learnt(self) -> list[int]:
        """Stages 1..S-1: microbatches whose gradient is in the sum since the last step (`unlearn` takes one out)."""
        return list(self._learnt)

    def __repr__(self) -> str:
        return f"StageWorker(peer={self.peer_id}, stage={self.stage}, layers={self.module.layer_ids})"

    # ---- forward / backward -----------------------------------------------------------------
    def inject(self, microbatch: int, tokens: torch.Tensor) -> torch.Tensor:
        """Stage 0: start a microbatch. tokens (B, T+1) -> activation (B, T, C) to send to the first hop.

        The first T tokens are the input and the last T the targets.
        """
        self._require(self.is_data_holder, "inject() runs on a data holder (stage 0)")
        self._check_new(microbatch)
        tokens = self._check_tokens(tokens)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        with self._autocast():
            out = self.module.run_layers(self.module.embed(inputs))
        self._stash[microbatch] = _Stash(inputs=inputs, output=out, targets=targets)
        return out.detach().to(self.dtype)

    def forward(self, microbatch: int, activation: torch.Tensor, *, stage: int | None = None) -> torch.Tensor:
        """Stages 1..S-1: run this stage's blocks on (B, T, C) and stash what the backward needs."""
        self._check_stage(stage)
        self._require(not self.is_data_holder, "stage 0 starts microbatches with inject() and ends them with loss()")
        self._check_new(microbatch)
        x = self._check_activation(activation, "activation").requires_grad_(True)
        with self._autocast():
            out = self.module.run_layers(x)
        self._stash[microbatch] = _Stash(inputs=x, output=out)
        return out.detach().to(self.dtype)

    def loss(self, microbatch: int, activation: torch.Tensor, *,
             accumulate: bool = True) -> tuple[float, torch.Tensor]:
        """Stage 0: the microbatch is back. Final norm, LM head, loss, and its backward.

        :param accumulate: False when the head's gradient of this microbatch is already in the sum (its loss
          was computed before the path broke): only the returning activation's gradient is computed
        :returns: the loss (mean next-token cross-entropy) and the gradient to send back along the
          reversed route (for a path of no hops, straight to `backward` here)
        """
        self._require(self.is_data_holder, "loss() runs on the data holder that injected the microbatch")
        stash = self._stash.get(microbatch)
        if stash is None:
            raise WorkerError(f"microbatch {microbatch} was not injected by {self.peer_id}")
        x = self._check_activation(activation, "returning activation", like=stash.output).requires_grad_(True)
        with self._autocast():
            loss = lm_loss(self.module.logits(x), stash.targets)
        if not accumulate:
            (grad,) = torch.autograd.grad(scaled_loss(loss, self.loss_scale), x)
            return float(loss.detach()), grad.detach()
        self._require(not self._unscaled, "gradients were already read for averaging; step() first")
        scaled_loss(loss, self.loss_scale).backward()
        return float(loss.detach()), x.grad.detach()

    def backward(self, microbatch: int, grad: torch.Tensor, *, stage: int | None = None,
                 accumulate: bool = True) -> torch.Tensor | None:
        """Backpropagate `grad` (same shape as this stage's output) through the stashed graph.

        :param accumulate: False when this stage's gradient already holds the microbatch (a re-queued one):
          only the gradient for the previous hop is computed, and it is not a visit
        :returns: the gradient for the previous hop; None at stage 0, where the microbatch ends
        """
        self._check_stage(stage)
        self._require(accumulate or not self.is_data_holder, "stage 0 always accumulates a microbatch's backward")
        stash = self._stash.get(microbatch)
        if stash is None:
            raise WorkerError(f"microbatch {microbatch} has no stashed forward on {self.peer_id} (stage {self.stage})")
        g = self._check_activation(grad, "gradient", like=stash.output)
        del self._stash[microbatch]
        if not accumulate:
            (grad_in,) = torch.autograd.grad(stash.output, stash.inputs, g.to(stash.output.dtype))
            return grad_in.detach()
        self._require(not self._unscaled, "gradients were already read for averaging; step() first")
        stash.output.backward(g.to(stash.output.dtype))
        self.visits += 1
        if self.is_data_holder:
            return None
        self._learnt[microbatch] = (stash.inputs.detach(), g)
        return stash.inputs.grad.detach()

    def unlearn(self, microbatch: int) -> bool:
        """Stages 1..S-1: take a microbatch's gradient back out of the sum, and its visit (its holder was left out
        of the commit: the iteration counts none of its microbatches, and their samples are drawn and learnt again).
        Its forward is recomputed from the input it came with and the gradient it brought is backpropagated negated,
        so the sum is what it would be without it (up to rounding). True if it was in the sum."""
        learnt = self._learnt.pop(microbatch, None)
        if learnt is None:
            return False
        self._require(not self._unscaled and self._mean_installed is None,
                      "gradients were already read or replaced for averaging; step() first")
        x, g = learnt[0].requires_grad_(True), learnt[1]
        with self._autocast():
            out = self.module.run_layers(x)
        out.backward(-g.to(out.dtype))
        self.visits -= 1
        return True

    def drop(self, microbatch: int) -> bool:
        """Forget a microbatch that will never come back (failed hop); True if it was stashed.

        Its gradient never reached this stage's parameters, so it does not count as a visit. (At
        stage 0 the head's gradient from an already computed loss stays in the sum.)
        """
        return self._stash.pop(microbatch, None) is not None

    def reset(self) -> None:
        """Abandon the iteration: forget every stashed microbatch and every accumulated gradient."""
        self._stash.clear()
        self._learnt.clear()
        self.optimizer.zero_grad(set_to_none=True)
        self.visits, self._mean_installed, self._unscaled = 0, None, False

    # ---- gradients and the optimizer step ------------------------------------------------------
    def gradient_sums(self) -> dict[str, torch.Tensor]:
        """Summed gradients since the last step, by parameter name (zeros where none arrived)."""
        self._require(self._mean_installed is None, "gradients were already replaced by the group mean")
        self._unscale()
        return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                for n, p in self.module.named_parameters()}

    def set_mean_gradients(self, grads: dict[str, torch.Tensor], visits: int) -> None:
        """Install the stage group's mean gradient (sum over peers / total visits) before `step`."""
        params = dict(self.module.named_parameters())
        if set(grads) != set(params):
            raise WorkerError(f"gradient names do not match stage {self.stage}'s parameters")
        for name, p in params.items():
            g = grads[name]
            if not isinstance(g, torch.Tensor) or g.shape != p.shape:
                raise WorkerError(f"gradient {name}: expected shape {tuple(p.shape)}")
        for name, p in params.items():
            # a stage nobody visited gets no gradient at all: AdamW then leaves its weights untouched
            p.grad = grads[name].detach().to(p.device, p.dtype).clone() if visits > 0 else None
        self._mean_installed = visits

    def step(self) -> StepStats:
        """Normalise the gradient by the microbatches that visited, clip, and take exactly one AdamW step."""
        if self._stash:
            raise WorkerError(f"{len(self._stash)} microbatch(es) {sorted(self._stash)} still await backward on "
                              f"{self.peer_id}; finish or drop them before stepping")
        if self._mean_installed is None:
            self._unscale()
        params = [p for p in self.module.parameters() if p.grad is not None]
        visits = self.visits if self._mean_installed is None else self._mean_installed
        if self._mean_installed is None and self.visits > 0:
            for p in params:
                p.grad.div_(self.visits)
        lr = lr_at(self.steps, self.optim_config)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        norm = torch.norm(torch.stack([p.grad.norm() for p in params])) if params else torch.tensor(0.0)
        skipped = not bool(torch.isfinite(norm))
        if skipped:
            logger.warning("peer %s stage %d: non-finite gradient, step %d skipped", self.peer_id, self.stage,
                           self.steps)
        else:
            if self.optim_config.grad_clip > 0 and params:
                torch.nn.utils.clip_grad_norm_(params, self.optim_config.grad_clip)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._learnt.clear()
        self.steps += 1
        self.visits, self._mean_installed, self._unscaled = 0, None, False
        return StepStats(step=self.steps, lr=lr, grad_norm=float(norm), visits=visits, skipped=skipped)

    # ---- checks -----------------------------------------------------------------------------
    def _require(self, ok: bool, why: str) -> None:
        if not ok:
            raise WorkerError(f"{self.peer_id} (stage {self.stage}): {why}")

    def _check_stage(self, stage: int | None) -> None:
        if stage is not None and stage != self.stage:
            raise WorkerError(f"{self.peer_id} serves stage {self.stage}, not stage {stage}")

    def _check_new(self, microbatch: int) -> None:
        if not isinstance(microbatch, int) or isinstance(microbatch, bool) or microbatch < 0:
            raise WorkerError(f"microbatch id must be a non-negative integer, got {microbatch!r}")
        if microbatch in self._stash:
            raise WorkerError(f"microbatch {microbatch} is already stashed on {self.peer_id}")
        if len(self._stash) >= self.memory_slots:
            raise MemoryLimitError(f"{self.peer_id} (stage {self.stage}) already holds {len(self._stash)} "
                                   f"activations, its memory limit is {self.memory_slots}; microbatch {microbatch} "
                                   "refused")

    def _check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex() \
                or tokens.dtype == torch.bool:
            raise WorkerError(f"tokens must be an integer tensor, got {getattr(tokens, 'dtype', type(tokens))}")
        if tokens.dim() != 2 or not 1 <= tokens.shape[0] <= MAX_MICROBATCH_SAMPLES \
                or not 2 <= tokens.shape[1] <= cfg.max_seq_len + 1:
            raise WorkerError(f"tokens must be (B, T+1) with B <= {MAX_MICROBATCH_SAMPLES} and "
                              f"2 <= T+1 <= {cfg.max_seq_len + 1}, got {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size):
            raise WorkerError(f"token ids must be in 0..{cfg.vocab_size - 1}")
        return tokens.to(self.device, torch.long)

    def _check_activation(self, x: torch.Tensor, what: str, like: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise WorkerError(f"{what} must be a tensor, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise WorkerError(f"{what} has dtype {x.dtype}, this run uses {self.dtype}")
        if like is not None:
            if x.shape != like.shape:
                raise WorkerError(f"{what} has shape {tuple(x.shape)}, expected {tuple(like.shape)}")
        elif x.dim() != 3 or x.shape[2] != self.config.dim or not 1 <= x.shape[0] <= MAX_MICROBATCH_SAMPLES \
                or not 1 <= x.shape[1] <= self.config.max_seq_len:
            raise WorkerError(f"{what} must be (B, T, {self.config.dim}) with B <= {MAX_MICROBATCH_SAMPLES} and "
                              f"T <= {self.config.max_seq_len}, got {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise WorkerError(f"{what} contains non-finite values")
        return x.detach().to(self.device)

    def _unscale(self) -> None:
        """Remove the loss scale from this iteration's gradient sums, once; drop them if they overflowed."""
        if self._unscaled or self.loss_scale == 1.0:
            return
        self._unscaled = True
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not unscale_gradients(grads, self.loss_scale):
            logger.warning("peer %s stage %d: fp16 gradient overflowed at loss scale %g, this peer's %d "
                           "microbatch(es) left out of step %d", self.peer_id, self.stage, self.loss_scale,
                           self.visits, self.steps)
            self.optimizer.zero_grad(set_to_none=True)
            self.visits = 0

    def _autocast(self) -> AbstractContextManager:
        return autocast(self.precision, self.device)
