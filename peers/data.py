"""Training data: documents from local files (or the bundled corpus), a held-out split, per-holder shards.

- The bundled default corpus is Python's own documentation (`pydoc_data.topics`, about 465 KB of
  English), so nothing is downloaded.
- Documents are split into train and validation by a seeded shuffle, tokenized with `<eos>` after
  each, concatenated, and cut into fixed windows of `seq_len + 1` tokens.
- Each data holder owns a deterministic, disjoint shard (every k-th window) and walks it in a
  seeded per-epoch order; its position (epoch, cursor) is saved and restored for an exact resume.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from peers.tokenizer import end_of_text_id, load_tokenizer

MAX_DATA_FILE_BYTES = 8 << 30
"""A data file larger than this is refused before reading."""


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from and how it is cut into microbatches."""

    paths: tuple[str, ...] = ()
    """Local .txt / .md files (paragraphs are documents) or .jsonl files (one {"text": ...} per line);
    empty = the bundled corpus."""
    tokenizer: str | None = None
    """A local tokenizer.json; None = train a byte-level BPE on the corpus once and cache it."""
    vocab_size: int = 4096
    """Vocabulary of the trained BPE (ignored with a tokenizer file)."""
    seq_len: int = 64
    """Tokens per sample."""
    batch_size: int = 8
    """Samples per microbatch (the paper: 8)."""
    validation_fraction: float = 0.1
    """Share of documents held out for validation."""
    seed: int = 0
    """Seeds the train/validation split and each shard's order."""

    def validate(self) -> None:
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"data.seq_len must be a positive integer, got {self.seq_len!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"data.batch_size must be a positive integer, got {self.batch_size!r}")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"data.validation_fraction must be in (0, 1), got {self.validation_fraction}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["paths"] = list(self.paths)
        return d

    @classmethod
    def from_dict(cls, data: Any) -> DataConfig:
        if not isinstance(data, dict):
            raise ValueError(f"data config must be a table, got {type(data).__name__}")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown data config field(s): {', '.join(sorted(unknown))}")
        data = dict(data)
        if "paths" in data:
            if not isinstance(data["paths"], (list, tuple)) or not all(isinstance(p, str) for p in data["paths"]):
                raise ValueError("data.paths must be a list of file paths")
            data["paths"] = tuple(data["paths"])
        cfg = cls(**data)
        cfg.validate()
        return cfg


def bundled_corpus() -> list[str]:
    """Python's documentation topics, in a stable order."""
    import pydoc_data.topics as topics

    return [topics.topics[k] for k in sorted(topics.topics)]


def read_documents(paths: Sequence[str]) -> list[str]:
    """Documents from local files; raises ValueError naming the file (and line) that is wrong."""
    docs: list[str] = []
    for raw in paths:
        p = Path(raw)
        if not p.is_file():
            raise ValueError(f"data file {p} does not exist")
        if p.stat().st_size > MAX_DATA_FILE_BYTES:
            raise ValueError(f"data file {p} is larger than {MAX_DATA_FILE_BYTES} bytes")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"data file {p} is not UTF-8 text: {e}") from None
        if p.suffix == ".jsonl":
            for n, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{p}:{n}: not valid JSON ({e})") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise ValueError(f'{p}:{n}: expected an object with a "text" string')
                docs.append(record["text"])
        else:
            docs.extend(block.strip() for block in text.split("\n\n") if block.strip())
    if not docs:
        raise ValueError(f"no documents in {', '.join(paths)}")
    return docs


class Corpus:
    """Tokenized train and validation streams of one run (built identically on every peer)."""

    def __init__(self, cfg: DataConfig, tokenizer: Tokenizer, train: torch.Tensor, validation: torch.Tensor) -> None:
        self.config, self.tokenizer = cfg, tokenizer
        self.train_tokens, self.validation_tokens = train, validation

    @classmethod
    def build(cls, cfg: DataConfig) -> Corpus:
        cfg.validate()
        docs = read_documents(cfg.paths) if cfg.paths else bundled_corpus()
        if len(docs) < 2:
            raise ValueError("the corpus needs at least two documents (one is held out for validation)")
        tokenizer = load_tokenizer(cfg.tokenizer, docs, vocab_size=cfg.vocab_size)
        order = list(range(len(docs)))
        random.Random(cfg.seed).shuffle(order)
        n_val = min(len(docs) - 1, max(1, round(len(docs) * cfg.validation_fraction)))
        val_ids, train_ids = sorted(order[:n_val]), sorted(order[n_val:])
        eos = end_of_text_id(tokenizer, cfg.tokenizer)  # `<eos>`, or an imported tokenizer's own
        return cls(cfg, tokenizer, _stream(tokenizer, [docs[i] for i in train_ids], eos),
                   _stream(tokenizer, [docs[i] for i in val_ids], eos))

    def with_documents(self, paths: Sequence[str]) -> Corpus:
        """The same tokenizer and validation split over other training documents (a peer's own data)."""
        docs = read_documents(paths)
        train = _stream(self.tokenizer, docs, end_of_text_id(self.tokenizer, self.config.tokenizer))
        return Corpus(replace(self.config, paths=tuple(paths)), self.tokenizer, train, self.validation_tokens)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def num_windows(self) -> int:
        """Training samples of seq_len + 1 tokens."""
        return len(self.train_tokens) // (self.config.seq_len + 1)

    def window(self, index: int) -> torch.Tensor:
        n = self.config.seq_len + 1
        return self.train_tokens[index * n:(index + 1) * n]

    def shard(self, holder: int, num_holders: int) -> Shard:
        return Shard(self, holder, num_holders)

    def validation_batches(self, max_batches: int | None = None) -> list[torch.Tensor]:
        """Fixed validation microbatches (B, seq_len + 1), the same on every call."""
        n, b = self.config.seq_len + 1, self.config.batch_size
        windows = len(self.validation_tokens) // n
        if windows == 0:
            raise ValueError(f"the validation split has fewer than seq_len + 1 = {n} tokens")
        rows = self.validation_tokens[:windows * n].view(windows, n)
        batches = [rows[i:i + b] for i in range(0, windows, b)]
        return batches if max_batches is None else batches[:max_batches]


def _stream(tokenizer: Tokenizer, docs: list[str], eos: int) -> torch.Tensor:
    ids: list[int] = []
    for enc in tokenizer.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


class Shard:
    """One data holder's disjoint part of the training windows, walked in a seeded order per epoch."""

    def __init__(self, corpus: Corpus, holder: int, num_holders: int) -> None:
        if not 0 <= holder < num_holders:
            raise ValueError(f"holder index {holder} outside 0..{num_holders - 1}")
        self.corpus, self.holder, self.num_holders = corpus, holder, num_holders
        self.indices = list(range(holder, corpus.num_windows(), num_holders))
        if len(self.indices) < corpus.config.batch_size:
            raise ValueError(f"shard {holder} of {num_holders} has {len(self.indices)} samples, fewer than one "
                             f"microbatch of {corpus.config.batch_size}: use more text, fewer data holders or a "
                             "smaller seq_len")
        self.epoch, self.cursor = 0, 0
        self._order = self._order_for(0)

    def _order_for(self, epoch: int) -> list[int]:
        order = list(self.indices)
        random.Random(f"{self.corpus.config.seed}/{self.holder}/{epoch}").shuffle(order)
        return order

    def next_batch(self) -> torch.Tensor:
        """The next microbatch (batch_size, seq_len + 1); a new epoch starts when too few samples remain."""
        b = self.corpus.config.batch_size
        if self.cursor + b > len(self._order):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._order_for(self.epoch)
        self.last_indices = self._order[self.cursor:self.cursor + b]
        """Training windows of the batch just returned (what a data ledger records)."""
        rows = [self.corpus.window(i) for i in self.last_indices]
        self.cursor += b
        return torch.stack(rows)

    def state_dict(self) -> dict[str, int]:
        return {"holder": self.holder, "num_holders": self.num_holders, "epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: Any) -> None:
        """Restore a saved position; refuses one from another sharding or out of range."""
        if not isinstance(state, dict) or any(not isinstance(state.get(k), int) or isinstance(state.get(k), bool)
                                              for k in ("holder", "num_holders", "epoch", "cursor")):
            raise ValueError("data position must have integer holder, num_holders, epoch and cursor")
        if (state["holder"], state["num_holders"]) != (self.holder, self.num_holders):
            raise ValueError(f"data position is for shard {state['holder']} of {state['num_holders']}, "
                             f"this is shard {self.holder} of {self.num_holders}")
        if state["epoch"] < 0 or not 0 <= state["cursor"] <= len(self.indices):
            raise ValueError(f"data position epoch={state['epoch']} cursor={state['cursor']} is out of range")
        self.epoch, self.cursor = state["epoch"], state["cursor"]
        self._order = self._order_for(self.epoch)
