"""The tokenizer: a local `tokenizer.json`, or a byte-level BPE trained once on the corpus and cached.

Training is deterministic for a given corpus and vocabulary size, and the cache file is named by a
hash of both, so every peer of a run that trains on the same text gets the same token ids.
"""

from __future__ import annotations

import hashlib
import json
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
TOKENIZER_CONFIG = "tokenizer_config.json"
"""Beside a tokenizer.json (Hugging Face's layout): names its special tokens, e.g. {"eos_token": "</s>"}."""


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


def read_tokenizer_file(path: Path) -> Tokenizer:
    """A tokenizer.json, refused (ValueError naming the file) if it is too large or not one."""
    if path.stat().st_size > MAX_TOKENIZER_FILE_BYTES:
        raise ValueError(f"tokenizer file {path} is larger than {MAX_TOKENIZER_FILE_BYTES} bytes")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises its own exception types
        raise ValueError(f"tokenizer file {path} could not be read: {e}") from None


def load_tokenizer(path: str | os.PathLike | None, texts: Sequence[str] | None = None, *,
                   vocab_size: int = 4096) -> Tokenizer:
    """Load `path` (a tokenizer.json), or train a BPE on `texts` once and reuse the cached file.

    :raises ValueError: the file is missing, too large, unreadable, or has no end-of-text token (`end_of_text_id`)
    """
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"tokenizer file {p} does not exist")
        tok = read_tokenizer_file(p)
        end_of_text_id(tok, p)  # refuses a tokenizer without a known end-of-text token
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


def special_token(path: str | os.PathLike, name: str) -> str | None:
    """The `name` special token ("eos_token", "bos_token") that a tokenizer_config.json beside tokenizer file
    `path` names, or None when there is no such file or entry. Hugging Face writes a plain string or an
    {"content": ...} object; anything else is refused."""
    cfg = Path(path).with_name(TOKENIZER_CONFIG)
    if not cfg.is_file():
        return None
    if cfg.stat().st_size > MAX_TOKENIZER_FILE_BYTES:
        raise ValueError(f"{cfg} is larger than {MAX_TOKENIZER_FILE_BYTES} bytes")
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg} is not valid JSON: {e}") from None
    value = data.get(name) if isinstance(data, dict) else None
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{cfg}: {name} must be a token string")
    return value


def end_of_text_id(tokenizer: Tokenizer, path: str | os.PathLike | None = None) -> int:
    """The id appended after each document: the `eos_token` that a tokenizer_config.json beside tokenizer file
    `path` names (an imported Hugging Face tokenizer's own, e.g. `</s>`), else skippipe's `<eos>`.

    :raises ValueError: neither names a token of `tokenizer`
    """
    named = special_token(path, "eos_token") if path is not None else None
    token = named or EOS
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        where = f"tokenizer file {path}" if path is not None else "the tokenizer"
        hint = "" if named else f" (name its end-of-text token as eos_token in a {TOKENIZER_CONFIG} beside it)"
        raise ValueError(f"{where} has no {token} token{hint}")
    return token_id
