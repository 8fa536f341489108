"""`DocumentStream`: the documents of local files (or of an in-memory list), read as a stream from any position.

- A text file (any suffix but .jsonl) holds blank-line separated documents, each stripped; a .jsonl file holds
  one `{"text": ...}` object per line. Newlines are universal (`\\r\\n` and `\\r` read as `\\n`), as before.
- Files are read in blocks, so memory depends on the largest document (at most `MAX_DOCUMENT_BYTES`), never on
  the size of a file: a corpus of tens of GB streams like a small one.
- A document that cannot be used (a malformed JSON line, one without a "text" string, bytes that are not UTF-8,
  a document over `MAX_DOCUMENT_BYTES`) is skipped, logged and counted, rather than stopping a holder hours into
  a pass; only a missing file, or a corpus with no documents at all, is an error.
- Documents are numbered 0, 1, 2... in reading order (skipped ones get no number), and each comes with the
  `DocPosition` it starts at: reading again from that position yields the same documents with the same numbers.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

MAX_DOCUMENT_BYTES = 16 << 20
"""A single document (a text paragraph, a jsonl line) larger than this is skipped with a warning."""
READ_BLOCK_BYTES = 1 << 20
"""Bytes read from a file at a time."""
MAX_LOGGED_SKIPS = 20
"""Skipped documents logged one by one per pass; the rest are only counted (and summed up at the end)."""
UNSUPPORTED_SUFFIXES = {".parquet": "parquet is not supported (no parquet reader is a dependency): convert it "
                                    "to jsonl, one {\"text\": ...} object per line"}

_TEXT_SEPARATOR = re.compile(rb"(?>\r\n|\r|\n)(?>\r\n|\r|\n)")
"""A blank line: two newlines of any convention (a `\\r\\n` pair is one newline)."""


@dataclass(frozen=True)
class DocPosition:
    """Where document number `index` starts: byte `offset` of file `file` (for an in-memory list: its index)."""

    index: int = 0
    file: int = 0
    offset: int = 0


class DocumentStream:
    """The documents of `paths` in order (or of `texts`, an in-memory list such as the bundled corpus).

    :raises ValueError: a path that is not a readable regular file, or a format that is not supported
    """

    def __init__(self, paths: Sequence[str] = (), texts: Sequence[str] | None = None) -> None:
        if (texts is None) == (not paths):
            raise ValueError("a document stream needs either files or texts")
        self.paths = tuple(Path(p) for p in paths)
        self.texts = texts
        for p in self.paths:
            if not p.is_file():
                raise ValueError(f"data file {p} does not exist")
            if p.suffix.lower() in UNSUPPORTED_SUFFIXES:
                raise ValueError(f"data file {p}: {UNSUPPORTED_SUFFIXES[p.suffix.lower()]}")

    @property
    def total_bytes(self) -> int:
        """Bytes of all files (characters of all texts): an upper bound on what one pass reads."""
        if self.texts is not None:
            return sum(len(t) for t in self.texts)
        return sum(p.stat().st_size for p in self.paths)

    def check_position(self, pos: DocPosition) -> None:
        """:raises ValueError: `pos` does not lie in this stream's files"""
        if self.texts is not None:
            if pos.file != 0 or not 0 <= pos.offset <= len(self.texts) or pos.index != pos.offset:
                raise ValueError(f"document position {pos} is outside the {len(self.texts)} documents")
            return
        if not 0 <= pos.file < len(self.paths) or pos.index < 0:
            raise ValueError(f"document position {pos} names no file of {len(self.paths)}")
        size = self.paths[pos.file].stat().st_size
        if not 0 <= pos.offset <= size:
            raise ValueError(f"document position {pos} is past the end of {self.paths[pos.file]} ({size} bytes)")

    def documents(self, start: DocPosition = DocPosition()) -> DocumentIterator:
        """The documents from `start` (a position this stream gave out, or the beginning) to the end."""
        return DocumentIterator(self, start)


class DocumentIterator:
    """One pass over a `DocumentStream` from a position: yields (position, text); `skipped` counts the documents
    left out, by reason."""

    def __init__(self, stream: DocumentStream, start: DocPosition) -> None:
        self.stream, self.start = stream, start
        self.skipped: Counter[str] = Counter()
        self._next_index = start.index
        self._gen = self._run()

    def __iter__(self) -> Iterator[tuple[DocPosition, str]]:
        return self

    def __next__(self) -> tuple[DocPosition, str]:
        return next(self._gen)

    def _run(self) -> Iterator[tuple[DocPosition, str]]:
        s = self.stream
        if s.texts is not None:
            for i in range(self.start.offset, len(s.texts)):
                yield DocPosition(i, 0, i), s.texts[i]
            return
        for f in range(self.start.file, len(s.paths)):
            offset = self.start.offset if f == self.start.file else 0
            read = _jsonl_documents if s.paths[f].suffix.lower() == ".jsonl" else _text_documents
            for at, text in read(s.paths[f], offset, self._skip):
                yield DocPosition(self._next_index, f, at), text
                self._next_index += 1
        if sum(self.skipped.values()) > MAX_LOGGED_SKIPS:
            logger.warning("skipped %d documents in one pass over the data: %s", sum(self.skipped.values()),
                           dict(self.skipped))

    def _skip(self, path: Path, offset: int, line: int | None, reason: str) -> None:
        self.skipped[reason] += 1
        if sum(self.skipped.values()) <= MAX_LOGGED_SKIPS:
            where = f"{path}:{line}" if line is not None else f"{path} at byte {offset}"
            logger.warning("%s: %s, skipped", where, reason)


def _text_documents(path: Path, offset: int, skip) -> Iterator[tuple[int, str]]:
    """(byte offset, document) of the blank-line separated documents of `path` from `offset` (a document start)."""
    for at, data in _segments(path, offset, _TEXT_SEPARATOR, skip):
        if data is None:
            continue
        text = _decode(data, path, at, None, skip)
        if text is None:
            continue
        text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
        if text:
            yield at, text


_LINE = re.compile(rb"\n")


def _jsonl_documents(path: Path, offset: int, skip) -> Iterator[tuple[int, str]]:
    """(byte offset, text) of each line of `path` from `offset` (a line start) that is {"text": str}."""
    line = 1 if offset == 0 else None
    for at, data in _segments(path, offset, _LINE, skip):
        n, line = line, (line + 1 if line is not None else None)
        if data is None or not data.strip():
            continue
        text = _decode(data, path, at, n, skip)
        if text is None:
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            skip(path, at, n, "not valid JSON")
            continue
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            skip(path, at, n, 'not an object with a "text" string')
            continue
        yield at, record["text"]


def _decode(data: bytes, path: Path, at: int, line: int | None, skip) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        skip(path, at, line, "not UTF-8 text")
        return None


def _segments(path: Path, offset: int, separator: re.Pattern[bytes], skip) -> Iterator[tuple[int, bytes | None]]:
    """(start, bytes) of the pieces of `path` between `separator`s, from `offset` (a piece start); bytes is None
    for a piece over `MAX_DOCUMENT_BYTES` (skipped and logged here, never held in memory whole).

    A separator is only taken once the byte after it has been read (or the file ended), so where the blocks happen
    to end never changes where a piece ends: reading from any piece's start gives the same pieces as reading from
    the file's start.
    """
    with path.open("rb") as f:
        f.seek(offset)
        buf, base, start, pos, oversized = b"", offset, offset, 0, False
        while True:
            block = f.read(READ_BLOCK_BYTES)
            eof = not block
            buf += block
            while True:
                m = separator.search(buf, pos)
                if m is None or (m.end() == len(buf) and not eof):
                    break
                yield start, _piece(buf, start - base, m.start(), oversized, path, start, skip)
                pos, start, oversized = m.end(), base + m.end(), False
            if eof:
                if start < base + len(buf):
                    yield start, _piece(buf, start - base, len(buf), oversized, path, start, skip)
                return
            keep = start - base
            if oversized or len(buf) - keep > MAX_DOCUMENT_BYTES:
                # drop the piece's bytes, keeping what could be the start of a separator (at most 3 bytes)
                oversized, keep = True, max(keep, len(buf) - 3)
            buf, base, pos = buf[keep:], base + keep, 0


def _piece(buf: bytes, lo: int, hi: int, oversized: bool, path: Path, start: int, skip) -> bytes | None:
    if oversized or hi - lo > MAX_DOCUMENT_BYTES:
        skip(path, start, None, f"a document over {MAX_DOCUMENT_BYTES} bytes")
        return None
    return buf[lo:hi]
