"""The tokenizer: a local `tokenizer.json`, or a byte-level BPE trained once on the corpus and cached.

Training is deterministic for a given corpus and vocabulary size, and the cache file is named by a
hash of both, so every peer of a run that trains on the same text gets the same token ids.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<pad>", "<eos>")
EOS = "<eos>"
MAX_TOKENIZER_FILE_BYTES = 64 << 20
"""A local tokenizer.json larger than this is refused before reading."""


def cache_dir() -> Path:
    """Where trained tokenizers are kept: $SKIPPIPE_CACHE, else ~/.cache/skippipe."""
    return Path(os.environ.get("SKIPPIPE_CACHE") or Path.home() / ".cache" / "skippipe")


def train_bpe(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE over `texts` with `<pad>` and `<eos>` specials (ids 0 and 1)."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"tokenizer vocab_size must be at least {256 + len(SPECIAL_TOKENS)}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def load_tokenizer(path: str | os.PathLike | None, texts: Sequence[str] | None = None, *,
                   vocab_size: int = 4096) -> Tokenizer:
    """Load `path` (a tokenizer.json), or train a BPE on `texts` once and reuse the cached file.

    :raises ValueError: the file is missing, too large, unreadable, or lacks the `<eos>` token
    """
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"tokenizer file {p} does not exist")
        if p.stat().st_size > MAX_TOKENIZER_FILE_BYTES:
            raise ValueError(f"tokenizer file {p} is larger than {MAX_TOKENIZER_FILE_BYTES} bytes")
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as e:  # the tokenizers library raises its own exception types
            raise ValueError(f"tokenizer file {p} could not be read: {e}") from None
        if tok.token_to_id(EOS) is None:
            raise ValueError(f"tokenizer file {p} has no {EOS} token")
        return tok
    if texts is None:
        raise ValueError("either a tokenizer file or texts to train one on are needed")
    digest = hashlib.sha256()
    for t in texts:
        digest.update(hashlib.sha256(t.encode()).digest())
    cached = cache_dir() / f"bpe-{vocab_size}-{digest.hexdigest()[:16]}.json"
    if cached.is_file():
        return Tokenizer.from_file(str(cached))
    logger.info("training a %d-token byte-level BPE on %d documents (cached at %s)", vocab_size, len(texts), cached)
    tok = train_bpe(texts, vocab_size)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, cached)  # atomic: peers sharing a cache never read half a file
    return tok
