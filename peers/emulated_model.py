"""What a bigger model's pipeline sends and computes, for emulating it with a small one (WAN studies).

A run that trains the tiny model can carry a model preset's messages (`swarm.message_bytes`, padding) and take
its compute time (`PacedWorker`, `--emulate-speed`). The sizes here follow the preset: one microbatch is
`tokens` tokens (default one sequence of the preset's context) of `dim` values in a half-precision wire dtype;
the paper's 1.5B configuration (d = 2048, context 4096) then sends 16 MiB per activation and per gradient.

Compute: the network profiles give a peer's seconds per layer for the paper's 500M-class layer on an 8 x
1024-token microbatch (`scheduler.profiles.DEFAULT_SECONDS_PER_LAYER`). A preset's stage takes that times the
ratio of model FLOPs (forward + backward, `6 x block parameters + 6 x context x dim` per token and layer, as
`benchmarks/gpu.py` counts them) of one of its microbatches through one of its layers, times its layers per
stage; a small model with fewer layers per stage spreads the same stage time over its own layers.
"""

from __future__ import annotations

from peers.model import FLAVORS, ModelConfig

REFERENCE_PRESET = "500m"
REFERENCE_TOKENS = 8 * 1024
"""The microbatch the profiles' seconds per layer are for: 8 sequences of the 500m preset's 1024 tokens."""
HALF_BYTES = 2


def _preset(name: str) -> ModelConfig:
    if name not in FLAVORS:
        raise ValueError(f"unknown model preset {name!r}; choose from {', '.join(FLAVORS)}")
    return FLAVORS[name]


def _tokens(cfg: ModelConfig, tokens: int | None) -> int:
    if tokens is None:
        return cfg.max_seq_len
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens per microbatch must be a positive integer, got {tokens!r}")
    return tokens


def message_bytes(preset: str, tokens: int | None = None, dtype_bytes: int = HALF_BYTES) -> int:
    """Bytes of one activation (or gradient) of `preset`: dim x tokens per microbatch x bytes per value.

    :param tokens: tokens per microbatch (default: one sequence of the preset's context)
    :raises ValueError: unknown preset, tokens < 1, dtype_bytes not 1, 2, 4 or 8
    """
    cfg = _preset(preset)
    if dtype_bytes not in (1, 2, 4, 8):
        raise ValueError(f"dtype_bytes must be 1, 2, 4 or 8, got {dtype_bytes!r}")
    return cfg.dim * _tokens(cfg, tokens) * dtype_bytes


def layer_flops(cfg: ModelConfig, tokens: int, context: int) -> float:
    """Model FLOPs of `tokens` tokens (sequences of `context`) through one block, forward and backward."""
    kv_dim = cfg.kv_heads * cfg.head_dim
    block = 2 * cfg.dim * cfg.dim + 2 * cfg.dim * kv_dim + 3 * cfg.dim * cfg.ffn_dim
    return tokens * (6 * block + 6 * context * cfg.dim)


def stage_time_scale(preset: str, stages: int, tokens: int | None = None) -> float:
    """Compute time of one microbatch through one stage of `preset` split in `stages`, in units of the profiles'
    seconds per layer (the reference 500M-class layer on its 8 x 1024-token microbatch).

    :raises ValueError: unknown preset, stages not in 1..n_layers, tokens < 1
    """
    cfg = _preset(preset)
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= cfg.n_layers:
        raise ValueError(f"stages must be 1-{cfg.n_layers} for {preset}, got {stages!r}")
    n = _tokens(cfg, tokens)
    ref = FLAVORS[REFERENCE_PRESET]
    per_layer = layer_flops(cfg, n, min(n, cfg.max_seq_len)) / layer_flops(ref, REFERENCE_TOKENS, ref.max_seq_len)
    return per_layer * cfg.n_layers / stages
