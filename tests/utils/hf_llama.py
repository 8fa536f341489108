"""Tiny Hugging Face Llama directories for the import/export and init-from tests (built locally, nothing
downloaded; `transformers` is a dev dependency, so callers skip when it is missing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TEXTS = ["the quick brown fox jumps over the lazy dog", "pipelines skip stages", "llamas hum softly"] * 20
VOCAB = 288
"""The model's vocabulary (padded past the tokenizer's 280 tokens, as real checkpoints often are)."""


def write_tokenizer(path: Path) -> None:
    """A small byte-level BPE with Llama's specials: <unk> 0, <s> 1, </s> 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=280, special_tokens=["<unk>", "<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.save(str(path))


def write_hf_llama(directory: Path, *, tied: bool, shard: str | None = None, seed: int | None = None) -> Any:
    """Save a 4-layer GQA LlamaForCausalLM (vocab 288, dim 64) and its tokenizer into `directory`; returns the
    model (eval mode). `shard` (e.g. "40KB") splits the weights into shards with an index."""
    import transformers

    torch.manual_seed((1 if tied else 2) if seed is None else seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-6, rope_theta=5000.0, tie_word_embeddings=tied,
                                   bos_token_id=1, eos_token_id=2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(directory, **({"max_shard_size": shard} if shard else {}))
    write_tokenizer(directory / "tokenizer.json")
    return model


def write_docs(path: Path) -> Path:
    """A small text corpus (paragraphs are documents) the tiny tokenizer covers."""
    path.write_text("\n\n".join(TEXTS))
    return path
