"""Training windows cut from a document stream, in resumable chunks, tokenized ahead in a background thread.

- The kept documents are tokenized with `<eos>` after each, concatenated, and cut into windows of `seq_len + 1`
  tokens; the tokens left at the end of a pass (fewer than a window) are dropped.
- Windows come in chunks of `SHUFFLE_WINDOWS`, each shuffled by a seed of its own: shuffling needs no more memory
  than one chunk, and a chunk can be made again from its `ChunkStart` alone (the document and token its first
  window starts at), which is what makes a position resumable without reading the data before it.
- `Prefetcher` runs such a generator in a daemon thread a bounded number of chunks ahead, so tokenizing overlaps
  training and memory stays at a few chunks, whatever the size of the corpus.
"""

from __future__ import annotations

import atexit
import queue
import random
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from peers.document_stream import DocPosition, DocumentStream

SHUFFLE_WINDOWS = 1024
"""Windows per chunk: the span over which training windows are shuffled."""
TOKENIZE_BATCH_BYTES = 256 << 10
"""Text handed to the tokenizer at once (it tokenizes a batch on all cores; its working memory is some 30
times the text)."""
PREFETCH_CHUNKS = 2
"""Chunks a shard tokenizes ahead of what it has handed out."""
_EXIT_WAIT_S = 10.0
"""At exit, how long to wait for prefetch threads to leave the tokenizer (killing one inside it aborts Python)."""


@dataclass(frozen=True)
class ChunkStart:
    """Chunk `cursor // SHUFFLE_WINDOWS` of pass `epoch`: its first window starts at token `token` (`<eos>`
    counted) of the document at `doc`."""

    epoch: int = 0
    cursor: int = 0
    doc: DocPosition = DocPosition()
    token: int = 0


@dataclass(frozen=True)
class Chunk:
    start: ChunkStart
    windows: torch.Tensor
    """(m, seq_len + 1) int64 token ids, shuffled; m = SHUFFLE_WINDOWS except in an epoch's last chunk."""
    ids: list[int]
    """Each row's window number in its epoch (`start.cursor` + its place before shuffling)."""
    last: bool
    """The epoch's last chunk (possibly empty): the next one starts epoch `start.epoch + 1`."""


def windows(stream: DocumentStream, tokenizer: Tokenizer, eos: int, seq_len: int, keep: Callable[[int], bool],
            doc: DocPosition = DocPosition(), token: int = 0) -> Iterator[tuple[np.ndarray, DocPosition, int]]:
    """(window, document, token) for each window of the documents `keep` accepts (by number), from token `token`
    of the document at `doc`: the window's tokens and where its first token lies."""
    n = seq_len + 1
    carry, carry_from = np.empty(0, dtype=np.int32), (doc, token)
    batch: list[tuple[DocPosition, str]] = []
    size = 0

    def flush() -> Iterator[tuple[np.ndarray, DocPosition, int]]:
        nonlocal carry, carry_from
        encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # the same ids, no offsets
        encodings = encode([text for _, text in batch])
        for (pos, _), enc in zip(batch, encodings, strict=True):
            ids = np.fromiter((*enc.ids, eos), dtype=np.int32, count=len(enc.ids) + 1)
            t0 = token if pos == doc else 0
            ids = ids[t0:]
            i = 0
            if len(carry):
                need = n - len(carry)
                if len(ids) < need:
                    carry = np.concatenate([carry, ids])
                    continue
                yield np.concatenate([carry, ids[:need]]), *carry_from
                i = need
            while i + n <= len(ids):
                yield ids[i:i + n], pos, t0 + i
                i += n
            carry, carry_from = ids[i:], (pos, t0 + i)
        batch.clear()

    for pos, text in stream.documents(doc):
        if not keep(pos.index):
            continue
        batch.append((pos, text))
        size += len(text)
        if size >= TOKENIZE_BATCH_BYTES:
            yield from flush()
            size = 0
    if batch:
        yield from flush()


def chunks(stream: DocumentStream, tokenizer: Tokenizer, eos: int, seq_len: int, keep: Callable[[int], bool],
           seed: str, start: ChunkStart = ChunkStart()) -> Iterator[Chunk]:
    """The chunks of pass `start.epoch` from `start` on, then of every later pass, endlessly. Chunk `c` of pass
    `e` is shuffled by `f"{seed}/{e}/{c}"`."""
    epoch, cursor, doc, token = start.epoch, start.cursor, start.doc, start.token
    while True:
        rows: list[np.ndarray] = []
        first = ChunkStart(epoch, cursor, doc, token)
        for window, pos, t in windows(stream, tokenizer, eos, seq_len, keep, doc, token):
            if not rows:
                first = ChunkStart(epoch, cursor, pos, t)
            rows.append(window)
            if len(rows) == SHUFFLE_WINDOWS:
                yield _chunk(first, rows, seq_len, seed, last=False)
                cursor, rows = cursor + SHUFFLE_WINDOWS, []
        if not rows:  # an empty last chunk: the pass ended on a chunk boundary (or has no windows at all)
            first = ChunkStart(epoch, cursor, DocPosition(), 0)
        yield _chunk(first, rows, seq_len, seed, last=True)
        epoch, cursor, doc, token = epoch + 1, 0, DocPosition(), 0


def _chunk(start: ChunkStart, rows: list[np.ndarray], seq_len: int, seed: str, *, last: bool) -> Chunk:
    order = list(range(len(rows)))
    random.Random(f"{seed}/{start.epoch}/{start.cursor // SHUFFLE_WINDOWS}").shuffle(order)
    data = np.stack([rows[i] for i in order]) if rows else np.empty((0, seq_len + 1), dtype=np.int32)
    return Chunk(start, torch.from_numpy(data).long(), [start.cursor + i for i in order], last)


class Prefetcher:
    """Items of an iterator made `depth` ahead in a daemon thread; an exception there is raised by `get`."""

    def __init__(self, items: Iterator[Any], *, depth: int = PREFETCH_CHUNKS, name: str = "prefetch") -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(items,), name=name, daemon=True)
        self._thread.start()
        _live.add(self)

    def _run(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                if not self._put((True, item)):
                    return
        except Exception as e:  # handed to the consumer, which names it
            self._put((False, e))
            return
        self._put((False, StopIteration()))

    def _put(self, entry: tuple[bool, Any]) -> bool:
        """Queue `entry` once there is room; False once closed (the thread then ends)."""
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def get(self) -> Any:
        """The next item; raises what the iterator raised (StopIteration at its end)."""
        ok, value = self._queue.get()
        if not ok:
            self._queue.put((False, value))  # every later get raises it too
            raise value
        return value

    def close(self) -> None:
        """Stop making items (the thread ends after the one in progress) and free the ones made."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return


_live: weakref.WeakSet[Prefetcher] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    prefetchers = list(_live)
    for p in prefetchers:
        p.close()
    for p in prefetchers:
        p._thread.join(_EXIT_WAIT_S / max(1, len(prefetchers)))
