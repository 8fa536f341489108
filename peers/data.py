"""Training data: documents streamed from local files (or the bundled corpus), a held-out split, per-holder shards.

- The bundled default corpus is Python's own documentation (`pydoc_data.topics`, about 465 KB of
  English), so nothing is downloaded. Local files are read as a stream (`peers.document_stream`): memory does
  not grow with the size of the corpus, and files of tens of GB are fine.
- Documents are numbered in reading order. Validation holds some out: when the whole corpus fits in the
  tokenizer's sample (`TOKENIZER_SAMPLE_BYTES`), a seeded shuffle picks `validation_fraction` of them as before;
  a larger corpus cannot be counted without reading it all, so each document is held out by a seeded hash of its
  number instead.
- Data holder h of n draws from the training documents numbered i with i % n == h: disjoint shards that together
  cover the training documents, found without reading the corpus first. A shard tokenizes its documents in a
  background thread (`<eos>` after each), cuts them into windows of `seq_len + 1` tokens and shuffles them in
  chunks (`peers.token_windows`).
- A shard's position (epoch, cursor: windows drawn in this pass) is saved and restored for an exact resume. It
  also names the chunk the cursor is in (document, byte offset, token), so a resume seeks there instead of
  reading the pass again; a position without those fields (the 4 that travel in commits) still resumes exactly,
  by tokenizing the shard's pass up to the cursor.
"""

from __future__ import annotations

import hashlib
import random
import weakref
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from peers.document_stream import DocPosition, DocumentStream
from peers.token_windows import SHUFFLE_WINDOWS, Chunk, ChunkStart, Prefetcher, chunks, windows
from peers.tokenizer import end_of_text_id, load_tokenizer

TOKENIZER_SAMPLE_BYTES = 32 << 20
"""A BPE is trained on the corpus's first documents up to this much text (all of a smaller corpus)."""
MAX_VALIDATION_WINDOWS = 4096
"""Validation windows kept at most (the first ones of the held-out documents)."""
RESUME_FIELDS = ("chunk", "doc", "file", "offset", "token")
"""Optional position fields: where the chunk holding the cursor starts (`ChunkStart`), for a resume by seeking."""


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


class HeldOut:
    """Which documents (by number) are validation documents: a fixed set, or those whose seeded hash falls under
    `fraction`."""

    def __init__(self, *, ids: frozenset[int] | None = None, fraction: float = 0.0, seed: int = 0) -> None:
        self.ids, self.fraction, self.seed = ids, fraction, seed

    @classmethod
    def exact(cls, num_documents: int, fraction: float, seed: int) -> HeldOut:
        """`fraction` of `num_documents` (at least one, never all) picked by a seeded shuffle."""
        order = list(range(num_documents))
        random.Random(seed).shuffle(order)
        n_val = min(num_documents - 1, max(1, round(num_documents * fraction)))
        return cls(ids=frozenset(order[:n_val]))

    def __call__(self, index: int) -> bool:
        if self.ids is not None:
            return index in self.ids
        digest = hashlib.blake2b(f"{self.seed}/{index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") < self.fraction * 2 ** 64


NOTHING_HELD_OUT = HeldOut(ids=frozenset())


class Validation:
    """The validation windows: held-out documents tokenized in order, concatenated and cut, the first
    `MAX_VALIDATION_WINDOWS` of them at most (computed once, as far as asked for)."""

    def __init__(self, documents: DocumentStream, held_out: HeldOut, tokenizer: Tokenizer, eos: int,
                 seq_len: int) -> None:
        self._args = (documents, tokenizer, eos, seq_len, held_out)
        self._rows = torch.empty((0, seq_len + 1), dtype=torch.long)
        self._complete = False

    def rows(self, limit: int) -> torch.Tensor:
        limit = min(limit, MAX_VALIDATION_WINDOWS)
        if len(self._rows) < limit and not self._complete:
            got = []
            for window, _, _ in windows(*self._args):
                got.append(window)
                if len(got) == limit:
                    break
            else:
                self._complete = True
            n = self._args[3] + 1
            self._rows = torch.from_numpy(np.stack(got)).long() if got else torch.empty((0, n), dtype=torch.long)
        return self._rows[:limit]


class Corpus:
    """The run's documents, tokenizer and validation split (built identically on every peer), cut into shards."""

    def __init__(self, cfg: DataConfig, tokenizer: Tokenizer, documents: DocumentStream, held_out: HeldOut,
                 validation: Validation | None = None) -> None:
        self.config, self.tokenizer, self.documents, self.held_out = cfg, tokenizer, documents, held_out
        self.eos = end_of_text_id(tokenizer, cfg.tokenizer)  # `<eos>`, or an imported tokenizer's own
        self.validation = validation or Validation(documents, held_out, tokenizer, self.eos, cfg.seq_len)
        self.max_windows = 2 * _utf8_bytes(documents) // (cfg.seq_len + 1) + 1
        """More windows than one pass can hold (a token is at least a byte, plus one `<eos>` per document)."""

    @classmethod
    def build(cls, cfg: DataConfig) -> Corpus:
        """:raises ValueError: a file is missing or unsupported, or the corpus has too few documents"""
        cfg.validate()
        documents = DocumentStream(cfg.paths) if cfg.paths else DocumentStream(texts=bundled_corpus())
        keep = cfg.tokenizer is None  # with a tokenizer file, the sample only counts the documents
        sample, count, complete = _sample(documents, TOKENIZER_SAMPLE_BYTES, keep=keep)
        if not count:
            raise ValueError(f"no documents in {', '.join(cfg.paths)}")
        if complete and count < 2:
            raise ValueError("the corpus needs at least two documents (one is held out for validation)")
        held_out = HeldOut.exact(count, cfg.validation_fraction, cfg.seed) if complete else \
            HeldOut(fraction=cfg.validation_fraction, seed=cfg.seed)
        tokenizer = load_tokenizer(cfg.tokenizer, sample if keep else None, vocab_size=cfg.vocab_size)
        return cls(cfg, tokenizer, documents, held_out)

    def with_documents(self, paths: Sequence[str]) -> Corpus:
        """The same tokenizer and validation split over other training documents (a peer's own data, none held
        out)."""
        documents = DocumentStream(paths)
        if not _sample(documents, 1, keep=False)[1]:
            raise ValueError(f"no documents in {', '.join(paths)}")
        return Corpus(replace(self.config, paths=tuple(paths)), self.tokenizer, documents, NOTHING_HELD_OUT,
                      self.validation)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def shard(self, holder: int, num_holders: int) -> Shard:
        return Shard(self, holder, num_holders)

    def validation_batches(self, max_batches: int | None = None) -> list[torch.Tensor]:
        """Fixed validation microbatches (B, seq_len + 1), the same on every call."""
        n, b = self.config.seq_len + 1, self.config.batch_size
        rows = self.validation.rows(MAX_VALIDATION_WINDOWS if max_batches is None else max_batches * b)
        if len(rows) == 0:
            raise ValueError(f"the validation split has fewer than seq_len + 1 = {n} tokens")
        return [rows[i:i + b] for i in range(0, len(rows), b)]


def _sample(documents: DocumentStream, max_bytes: int, *, keep: bool) -> tuple[list[str], int, bool]:
    """The first documents up to `max_bytes` of text (if `keep`), how many, and whether they are all of them."""
    sample, size, count = [], 0, 0
    for _, text in documents.documents():
        if size >= max_bytes:
            return sample, count, False
        if keep:
            sample.append(text)
        size, count = size + len(text), count + 1
    return sample, count, True


def _utf8_bytes(documents: DocumentStream) -> int:
    if documents.texts is not None:
        return sum(len(t.encode()) for t in documents.texts)
    return documents.total_bytes


class Shard:
    """One data holder's disjoint part of the training documents, as windows shuffled chunk by chunk, epoch after
    epoch. Not thread-safe: one caller draws."""

    def __init__(self, corpus: Corpus, holder: int, num_holders: int) -> None:
        if not 0 <= holder < num_holders:
            raise ValueError(f"holder index {holder} outside 0..{num_holders - 1}")
        self.corpus, self.holder, self.num_holders = corpus, holder, num_holders
        self.epoch, self.cursor = 0, 0
        self.last_indices: list[int] = []
        """Window numbers (in the epoch) of the batch just returned: what a data ledger records."""
        self._chunk: Chunk | None = None
        self._used = 0
        self._feed: Prefetcher | None = None
        self._feeds: list[Prefetcher] = []  # the live one, closed when the shard is collected
        weakref.finalize(self, _close_all, self._feeds)

    def _keep(self) -> Callable[[int], bool]:
        held_out, holder, n = self.corpus.held_out, self.holder, self.num_holders
        return lambda i: i % n == holder and not held_out(i)

    def _start(self, start: ChunkStart) -> Prefetcher:
        c = self.corpus
        items = chunks(c.documents, c.tokenizer, c.eos, c.config.seq_len, self._keep(),
                       f"{c.config.seed}/{self.holder}", start)
        return Prefetcher(items, name=f"shard-{self.holder}-of-{self.num_holders}")

    def _use(self, feed: Prefetcher) -> None:
        if self._feed is not None:
            self._feed.close()
        self._feeds[:] = [feed]
        self._feed = feed

    def _next_chunk(self) -> Chunk:
        if self._feed is None:
            if self._chunk is None:
                self._use(self._start(ChunkStart(self.epoch)))
            else:  # closed since: make the current chunk again, and the ones after it
                self.load_state_dict(self.state_dict())
        try:
            return self._feed.get()
        except Exception as e:
            raise ValueError(f"reading shard {self.holder} of {self.num_holders} failed: {e}") from e

    def next_batch(self) -> torch.Tensor:
        """The next microbatch (batch_size, seq_len + 1); a new epoch starts when too few samples remain.

        :raises ValueError: a whole pass holds fewer windows than a microbatch
        """
        b = self.corpus.config.batch_size
        rows: list[torch.Tensor] = []
        ids: list[int] = []
        taken = 0
        while taken < b:
            if self._chunk is None or self._used == len(self._chunk.windows):
                if self._chunk is not None and self._chunk.last:
                    if self._chunk.start.cursor + len(self._chunk.windows) < b:
                        raise ValueError(
                            f"shard {self.holder} of {self.num_holders} has {self.cursor} samples, fewer than one "
                            f"microbatch of {b}: use more text, fewer data holders or a smaller seq_len")
                    self.epoch, self.cursor, rows, ids, taken = self.epoch + 1, 0, [], [], 0
                self._chunk, self._used = self._next_chunk(), 0
                continue
            k = min(b - taken, len(self._chunk.windows) - self._used)
            rows.append(self._chunk.windows[self._used:self._used + k])
            ids.extend(self._chunk.ids[self._used:self._used + k])
            self._used, self.cursor, taken = self._used + k, self.cursor + k, taken + k
        self.last_indices = ids
        return torch.cat(rows)

    def state_dict(self) -> dict[str, int]:
        """Holder, num_holders, epoch and cursor; and where the chunk holding the cursor starts (`RESUME_FIELDS`)."""
        start = self._chunk.start if self._chunk is not None else ChunkStart(self.epoch)
        return {"holder": self.holder, "num_holders": self.num_holders, "epoch": self.epoch, "cursor": self.cursor,
                "chunk": start.cursor, "doc": start.doc.index, "file": start.doc.file, "offset": start.doc.offset,
                "token": start.token}

    def load_state_dict(self, state: Any) -> None:
        """Restore a saved position (with `RESUME_FIELDS` by seeking, without by reading its pass up to it);
        refuses one from another sharding or out of range, leaving the shard as it was."""
        if not isinstance(state, dict) or any(not _is_int(state.get(k))
                                              for k in ("holder", "num_holders", "epoch", "cursor")):
            raise ValueError("data position must have integer holder, num_holders, epoch and cursor")
        if (state["holder"], state["num_holders"]) != (self.holder, self.num_holders):
            raise ValueError(f"data position is for shard {state['holder']} of {state['num_holders']}, "
                             f"this is shard {self.holder} of {self.num_holders}")
        epoch, cursor = state["epoch"], state["cursor"]
        if epoch < 0 or not 0 <= cursor <= self.corpus.max_windows:
            raise ValueError(f"data position epoch={epoch} cursor={cursor} is out of range")
        start = ChunkStart(epoch)
        if any(k in state for k in RESUME_FIELDS):
            start = self._resume_point(state)
        feed = self._start(start)
        try:
            while True:  # the chunk holding the cursor: the first one, or (without a resume point) a later one
                try:
                    chunk = feed.get()
                except Exception as e:
                    raise ValueError(f"data position epoch={epoch} cursor={cursor}: reading failed: {e}") from e
                if chunk.start.epoch != epoch or chunk.start.cursor > cursor:
                    raise ValueError(f"data position epoch={epoch} cursor={cursor} is out of range")
                if cursor <= chunk.start.cursor + len(chunk.windows):
                    break
                if chunk.last:
                    raise ValueError(f"data position epoch={epoch} cursor={cursor} is out of range: the pass has "
                                     f"{chunk.start.cursor + len(chunk.windows)} samples")
        except ValueError:
            feed.close()
            raise
        self._use(feed)
        self.epoch, self.cursor = epoch, cursor
        self._chunk, self._used = chunk, cursor - chunk.start.cursor

    def _resume_point(self, state: dict) -> ChunkStart:
        if any(not _is_int(state.get(k)) or state[k] < 0 for k in RESUME_FIELDS):
            raise ValueError(f"data position must have non-negative integers {', '.join(RESUME_FIELDS)} (or none)")
        chunk = state["chunk"]
        if chunk % SHUFFLE_WINDOWS or not chunk <= state["cursor"] <= chunk + SHUFFLE_WINDOWS:
            raise ValueError(f"data position chunk={chunk} does not hold cursor={state['cursor']}")
        doc = DocPosition(state["doc"], state["file"], state["offset"])
        self.corpus.documents.check_position(doc)
        return ChunkStart(state["epoch"], chunk, doc, state["token"])

    def close(self) -> None:
        """Stop tokenizing ahead (a shard handed to another holder); drawing again picks up where it stood."""
        _close_all(self._feeds)
        self._feed = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _close_all(feeds: list[Prefetcher]) -> None:
    for feed in feeds:
        feed.close()
    feeds.clear()
