"""`DataLedger`: a data holder's record of every sample it handed out, so none is lost or trained twice.

Each draw is one line of a JSON-lines file: the iteration, the schedule epoch, the shard and the training
windows of one microbatch, with a status: `pending` when drawn, then `processed` once the iteration commits, or
`requeued` when the iteration is abandoned (run again, or committed without this holder) and its samples are drawn
again. A microbatch its holder ran again within the iteration (a relay holding its activations died) is noted
`retried`: its samples are not drawn again, and still count as processed once, at the commit.
The file is appended and flushed as it goes, so a restarted holder (or an auditor) can read it back; the
`processed` and `requeued` lines, the ones that settle a draw's fate, are fsynced too. A crash can tear only the
last line: `read_ledger` skips it with a warning, and a ledger reopened for appending cuts it off first.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from peers.durable import fsync_dir

logger = logging.getLogger(__name__)


class DataLedger:
    """Append-only ledger of one data holder's draws (in memory, and on disk when `path` is given)."""

    def __init__(self, path: str | Path | None = None, *, holder: str = "") -> None:
        self.path = Path(path) if path else None
        self.holder = holder
        self.entries: list[dict[str, Any]] = []
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _cut_torn_tail(self.path)
        self._dir_synced = False

    def draw(self, *, iteration: int, epoch: int, shard: int, data_epoch: int, microbatch: int,
             windows: list[int]) -> None:
        """`windows` of `shard` (in its `data_epoch`-th pass over the data) went into `microbatch`."""
        self._log({"event": "draw", "iteration": iteration, "epoch": epoch, "shard": shard, "data_epoch": data_epoch,
                   "microbatch": microbatch, "windows": [int(w) for w in windows]})

    def commit(self, iteration: int) -> None:
        """Every sample drawn for `iteration` is processed (the iteration's gradients were applied)."""
        self._log({"event": "processed", "iteration": iteration}, durable=True)

    def requeue(self, iteration: int) -> None:
        """The draws of `iteration` were abandoned; their samples will be drawn again."""
        self._log({"event": "requeued", "iteration": iteration}, durable=True)

    def retry(self, iteration: int, microbatch: int, attempt: int) -> None:
        """`microbatch` of `iteration` ran again (`attempt`) after a peer on its path died: same samples."""
        self._log({"event": "retried", "iteration": iteration, "microbatch": microbatch, "attempt": attempt})

    def _log(self, entry: dict[str, Any], durable: bool = False) -> None:
        """Append `entry`; with `durable`, return only once it (and every line before it) is on disk."""
        entry = {"holder": self.holder, **entry}
        self.entries.append(entry)
        if self.path:
            with self.path.open("a") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            if durable and not self._dir_synced:  # the file's own directory entry, once
                fsync_dir(self.path.parent)
                self._dir_synced = True


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a ledger file, in order.

    A last line that does not parse is what a crash mid-append leaves: it is skipped with a warning. Any other
    bad line cannot come from a crash (lines before the last were complete when the next was appended), so it is
    an error rather than a silent loss of the draws it recorded.

    :raises ValueError: a line is not a JSON object (the last one: parses, but not to an object); the message
      names its line number
    """
    lines = Path(path).read_bytes().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    entries = []
    for i, line in enumerate(lines[:last + 1]):
        if not line.strip():
            continue
        entry = _parse(line)
        if entry is None and i == last:
            logger.warning("ledger %s: torn last line %d skipped (%d bytes)", path, i + 1, len(line))
            break
        if not isinstance(entry, dict):
            raise ValueError(f"ledger {path}: line {i + 1} is not a JSON object")
        entries.append(entry)
    return entries


def _parse(line: bytes) -> Any:
    """The JSON value of `line`, or None when it does not parse (a JSON `null` is no entry either)."""
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _cut_torn_tail(path: Path) -> None:
    """Cut a torn last line (unterminated or unparseable) off `path`, so the next append starts a clean line."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if not data:
        return
    body = data[:-1] if data.endswith(b"\n") else data
    start = body.rfind(b"\n") + 1
    if data.endswith(b"\n") and (not body[start:].strip() or _parse(body[start:]) is not None):
        return
    logger.warning("ledger %s: cutting off a torn last line (%d bytes)", path, len(data) - start)
    with path.open("r+b") as f:
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())


def committed(records: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], frozenset[str]]:
    """The scheduler's commits from its metrics lines (1-based `iteration`, `epoch`, `left_out`): (iteration,
    epoch) -> the holders whose draws the commit did not count (taken for gone while it ran, or late)."""
    return {(int(r["iteration"]) - 1, int(r["epoch"])): frozenset(r.get("left_out", ())) for r in records}


def sample_status(entries: list[dict[str, Any]], commits: Mapping[tuple[int, int], Collection[str]] | None = None
                  ) -> dict[tuple[int, int, int], Counter]:
    """(shard, data epoch, window) -> how often it was processed / requeued / left pending (and retried within
    an iteration), over ledgers.

    A draw's fate is the first `processed` or `requeued` event of its holder for its iteration after it. With
    `commits` (the scheduler's committed (iteration, epoch) pairs, the ground truth, each with the holders it left
    out: `committed`), a draw whose iteration was committed in its epoch, its holder not left out, counts as
    processed even if its holder died before writing so.
    """
    status: dict[tuple[int, int, int], Counter] = {}
    open_draws: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for e in entries:
        key = (e["holder"], e["iteration"])
        if e["event"] == "draw":
            open_draws.setdefault(key, []).append(e)
        elif e["event"] == "retried":
            for d in open_draws.get(key, []):
                if d["microbatch"] == e["microbatch"]:
                    for w in d["windows"]:
                        status.setdefault((d["shard"], d["data_epoch"], w), Counter())["retried"] += 1
        else:
            for d in open_draws.pop(key, []):
                for w in d["windows"]:
                    status.setdefault((d["shard"], d["data_epoch"], w), Counter())[e["event"]] += 1
    for draws in open_draws.values():
        for d in draws:
            left_out = commits.get((d["iteration"], d["epoch"])) if commits is not None else None
            fate = "processed" if left_out is not None and d["holder"] not in left_out else "pending"
            for w in d["windows"]:
                status.setdefault((d["shard"], d["data_epoch"], w), Counter())[fate] += 1
    return status
