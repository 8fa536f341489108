"""`read_json_lines`: the JSON objects of a JSON-lines file written by a process we do not trust to have finished.

A run directory is hostile input: a killed process leaves a torn last line, a disk fills, someone edits a file. Each
line is parsed on its own; one that is not a JSON object (bad UTF-8, bad JSON, too deep, too long) is skipped and
counted, never raised. Only regular files are read (a FIFO or a device named like a metrics file would block or never
end), and each line is read with a length limit, so a file without newlines cannot fill memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_LINE_BYTES = 1 << 20
"""Longer lines are skipped as malformed (a span or a metrics line is a few hundred bytes)."""


class LineCounter:
    """How many lines of one file were read and how many of them were skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        self.skipped = 0

    def warning(self, what: str = "malformed") -> str | None:
        """A one-line warning if lines were skipped, naming the file and saying why (None if none were)."""
        if not self.skipped:
            return None
        return f"{self.path.name}: {self.skipped} of {self.lines} lines skipped ({what})"


def read_json_lines(path: Path, counter: LineCounter) -> Iterator[dict[str, Any]]:
    """Yield each line of `path` that is a JSON object; count every line and every skipped one in `counter`.

    :raises OSError: the file cannot be opened (the caller decides whether that is fatal)
    """
    with path.open("rb") as f:
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                _skip_rest_of_line(f)
                counter.lines += 1
                counter.skipped += 1
                continue
            if not line.strip():
                continue
            counter.lines += 1
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):  # bad UTF-8 or JSON (both ValueError), or nested too deep
                counter.skipped += 1
                continue
            if not isinstance(value, dict):
                counter.skipped += 1
                continue
            yield value


def _skip_rest_of_line(f) -> None:
    while True:
        chunk = f.readline(MAX_LINE_BYTES)
        if not chunk or chunk.endswith(b"\n"):
            return


def regular_file(path: Path) -> bool:
    """Whether `path` is a regular file (following links): never a FIFO, a device or a directory."""
    try:
        return path.is_file()
    except OSError:
        return False
