"""The full definition of skippipe's LLaMA-style decoder, in one file.

RMSNorm, rotary position embeddings, causal scaled-dot-product attention, a SwiGLU MLP, pre-norm
blocks. Two things differ from a plain LLaMA and make pipeline skipping possible:

- each block computes its rotary embedding itself from the sequence length it sees, so a block
  runs correctly wherever it sits on a path (nothing positional travels between stages);
- blocks live in a `ModuleDict` keyed by layer index and the embedding, final norm and head are
  optional, so a stage is "the model minus what this peer does not own" and its `state_dict` keys
  are the full model's keys (checkpoints from any placement merge without renaming).

Weights are initialised per parameter from a generator seeded by (seed, parameter name), so a
stage built alone gets exactly the weights the full model built with the same seed would have.

References: LLaMA (Touvron et al. 2023), nanoGPT's model.py, torchtitan's llama3 decoder.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the decoder. Every field is checked by `validate`."""

    vocab_size: int = 4096
    """Tokens in the vocabulary (set from the tokenizer when training on a corpus)."""
    dim: int = 128
    """Width of the residual stream."""
    n_layers: int = 6
    """Decoder blocks."""
    n_heads: int = 4
    """Attention heads; dim must be divisible by it."""
    ffn_dim: int = 352
    """Hidden width of the SwiGLU MLP."""
    max_seq_len: int = 128
    """Longest sequence the model accepts (rotary tables are built on the fly up to this)."""
    rope_theta: float = 10000.0
    """Base of the rotary frequencies."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    # fields added for imported models (grouped-query attention, tied embeddings); `to_dict` leaves them out
    # at their defaults, so the dict of a model without them is exactly what older builds wrote and compare
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None = n_heads. n_heads must be a multiple of it."""
    tie_embeddings: bool = False
    """The LM head reuses the token embedding's weight (both live on stage 0)."""

    def validate(self) -> None:
        """Raise ValueError naming the field that is wrong."""
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "ffn_dim", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.{name} must be a positive integer, got {value!r}")
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ValueError(f"model.dim={self.dim} must split into n_heads={self.n_heads} heads of even size")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"model.{name} must be a positive number, got {value!r}")
        kv = self.n_kv_heads
        if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or self.n_heads % kv):
            raise ValueError(f"model.n_kv_heads must be a positive divisor of n_heads={self.n_heads}, got {kv!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"model.tie_embeddings must be true or false, got {self.tie_embeddings!r}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads actually used (n_kv_heads, else n_heads)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("n_kv_heads", "tie_embeddings"):
            if d[name] == getattr(ModelConfig, name):
                del d[name]
        return d

    @classmethod
    def from_dict(cls, data: Any) -> ModelConfig:
        """Build from untrusted plain data (a checkpoint's JSON, a TOML table); unknown keys are refused."""
        if not isinstance(data, dict):
            raise ValueError(f"model config must be a table, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown model config field(s): {', '.join(sorted(unknown))}")
        cfg = cls(**data)
        cfg.validate()
        return cfg

    def num_params(self) -> int:
        """Parameters of the full model (the head counted once more unless tied to the embedding)."""
        kv_dim = self.kv_heads * self.head_dim
        block = 2 * self.dim * self.dim + 2 * self.dim * kv_dim + 3 * self.dim * self.ffn_dim + 2 * self.dim
        embeddings = (1 if self.tie_embeddings else 2) * self.vocab_size * self.dim
        return self.n_layers * block + embeddings + self.dim


FLAVORS: dict[str, ModelConfig] = {
    # trains visibly on 2 CPU cores in a minute or two; the default for tests, the demo and examples/
    "tiny": ModelConfig(vocab_size=4096, dim=128, n_layers=6, n_heads=4, ffn_dim=352, max_seq_len=128),
    # a small GPU study model (~30M parameters)
    "small": ModelConfig(vocab_size=8192, dim=512, n_layers=12, n_heads=8, ffn_dim=1408, max_seq_len=512),
    # the paper's 500M-class configuration: 6 stages x 4 layers
    "500m": ModelConfig(vocab_size=32000, dim=1024, n_layers=24, n_heads=16, ffn_dim=4096, max_seq_len=1024),
    # the paper's 1.5B-class configuration (d=2048, ctx 4096)
    "1.5b": ModelConfig(vocab_size=32000, dim=2048, n_layers=24, n_heads=16, ffn_dim=6144, max_seq_len=4096),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def rotary_tables(seq_len: int, head_dim: int, theta: float, device: torch.device,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles for positions 0..seq_len-1, each (T, head_dim/2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float64), inv_freq)  # (T, hd/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (even, odd) pair of x's last dimension; x is (B, nh, T, hd).

    Hugging Face's Llama pairs dimension i with i + hd/2 instead (`rotate_half`). Rather than a second layout
    here, `peers.hf_llama` permutes the rows of imported q/k weights into this one (the inverse of the permutation
    in HF's own Meta-to-HF converter): exact, since a head's q.k is unchanged by permuting both alike.
    """
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (B, nh, T, hd/2) each
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, nh, T, hd/2, 2)
    return out.flatten(-2)  # (B, nh, T, hd)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.theta = cfg.n_heads, cfg.head_dim, cfg.rope_theta
        self.n_kv_heads = cfg.kv_heads
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        # computed here, from T alone: the block needs nothing positional from the previous hop
        cos, sin = rotary_tables(T, self.head_dim, self.theta, x.device, q.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.n_kv_heads != self.n_heads:
            # grouped-query attention: query head i reads kv head i // (nh / nkv), as HF's repeat_kv; SDPA's
            # enable_gqa would avoid the copy but needs torch >= 2.5 and we support 2.1
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, nh, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))  # (B, T, C)


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = SwiGLU(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """The decoder, or the part of it one peer owns.

    :param layers: layer indices this module holds (default: all); missing ones are simply absent
    :param with_embedding: hold the token embedding (stage 0)
    :param with_head: hold the final norm and LM head (stage 0)
    :param recompute: keep only each block's input for the backward and recompute the block's insides then
      (activation checkpointing): saved activations shrink from a block's dozen tensors to one, for ~1/3 more
      compute; gradients are the same
    """

    def __init__(self, cfg: ModelConfig, *, layers: Iterable[int] | None = None, with_embedding: bool = True,
                 with_head: bool = True, seed: int = 0, recompute: bool = False) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.recompute = recompute
        ids = sorted(set(range(cfg.n_layers) if layers is None else layers))
        if any(not 0 <= i < cfg.n_layers for i in ids):
            raise ValueError(f"layer indices {ids} outside 0..{cfg.n_layers - 1}")
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim) if with_embedding else None
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in ids})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps) if with_head else None
        if cfg.tie_embeddings and with_head and not with_embedding:
            raise ValueError("model.tie_embeddings: the LM head needs the token embedding in the same module")
        # tied: no `output` module, the head reads the embedding's weight (one tensor in the state_dict)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False) if with_head and not cfg.tie_embeddings \
            else None
        self.init_weights(seed)

    @property
    def layer_ids(self) -> list[int]:
        return sorted(int(k) for k in self.layers)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Seed each parameter from (seed, its name): identical weights whatever part of the model is built."""
        depth_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            # residual projections get the depth-scaled std (GPT-2 / nanoGPT)
            std = depth_std if name.endswith(("wo.weight", "w2.weight")) else 0.02
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(std).to(p.dtype))

    # ---- the three pieces a pipeline calls separately --------------------------------------
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, C) activations."""
        if self.tok_embeddings is None:
            raise RuntimeError("this part of the model has no token embedding (not stage 0)")
        return self.tok_embeddings(tokens)

    def run_layers(self, h: torch.Tensor, order: Iterable[int] | None = None) -> torch.Tensor:
        """Run the held blocks over (B, T, C) activations, in ascending order unless `order` says otherwise.

        With `recompute` (and autograd recording), each block is a non-reentrant checkpoint: its input is the
        only tensor it saves, and its forward runs again inside the backward (under the same autocast).
        """
        checkpointed = self.recompute and torch.is_grad_enabled()
        for i in self.layer_ids if order is None else order:
            block = self.layers[str(i)]
            h = checkpoint(block, h, use_reentrant=False) if checkpointed else block(h)
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (B, T, vocab) through the final norm and LM head (the embedding's weight when tied)."""
        if self.norm is None:
            raise RuntimeError("this part of the model has no LM head (not stage 0)")
        if self.output is None:
            return F.linear(self.norm(h), self.tok_embeddings.weight)
        return self.output(self.norm(h))

    def forward(self, tokens_or_h: torch.Tensor) -> torch.Tensor:
        """Embedding (when held and given ids), the held blocks, then the head (when held).

        Missing pieces pass through, so the full model is `logits = model(tokens)`.
        """
        h = self.embed(tokens_or_h) if self.tok_embeddings is not None and not tokens_or_h.is_floating_point() \
            else tokens_or_h
        h = self.run_layers(h)
        return self.logits(h) if self.norm is not None else h


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits (B, T, V), targets (B, T)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
