"""`DataLedger`: a data holder's record of every sample it handed out, so none is lost or trained twice.

Each draw is one line of a JSON-lines file: the iteration, the schedule epoch, the shard and the training
windows of one microbatch, with a status: `pending` when drawn, then `processed` once the iteration
commits, or `requeued` when the iteration is abandoned (a data holder died) and its samples are drawn again. A
microbatch its holder ran again within the iteration (a relay holding its activations died) is noted `retried`:
its samples are not drawn again, and still count as processed once, at the commit.
The file is appended and flushed as it goes, so a restarted holder (or an auditor) can read it back.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


class DataLedger:
    """Append-only ledger of one data holder's draws (in memory, and on disk when `path` is given)."""

    def __init__(self, path: str | Path | None = None, *, holder: str = "") -> None:
        self.path = Path(path) if path else None
        self.holder = holder
        self.entries: list[dict[str, Any]] = []
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def draw(self, *, iteration: int, epoch: int, shard: int, data_epoch: int, microbatch: int,
             windows: list[int]) -> None:
        """`windows` of `shard` (in its `data_epoch`-th pass over the data) went into `microbatch`."""
        self._log({"event": "draw", "iteration": iteration, "epoch": epoch, "shard": shard, "data_epoch": data_epoch,
                   "microbatch": microbatch, "windows": [int(w) for w in windows]})

    def commit(self, iteration: int) -> None:
        """Every sample drawn for `iteration` is processed (the iteration's gradients were applied)."""
        self._log({"event": "processed", "iteration": iteration})

    def requeue(self, iteration: int) -> None:
        """The draws of `iteration` were abandoned; their samples will be drawn again."""
        self._log({"event": "requeued", "iteration": iteration})

    def retry(self, iteration: int, microbatch: int, attempt: int) -> None:
        """`microbatch` of `iteration` ran again (`attempt`) after a peer on its path died: same samples."""
        self._log({"event": "retried", "iteration": iteration, "microbatch": microbatch, "attempt": attempt})

    def _log(self, entry: dict[str, Any]) -> None:
        entry = {"holder": self.holder, **entry}
        self.entries.append(entry)
        if self.path:
            with self.path.open("a") as f:
                f.write(json.dumps(entry) + "\n")


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def sample_status(entries: list[dict[str, Any]], commits: set[tuple[int, int]] | None = None
                  ) -> dict[tuple[int, int, int], Counter]:
    """(shard, data epoch, window) -> how often it was processed / requeued / left pending (and retried within
    an iteration), over ledgers.

    A draw's fate is the first `processed` or `requeued` event of its holder for its iteration after it. With
    `commits` (the scheduler's committed (iteration, epoch) pairs, the ground truth), a draw whose iteration was
    committed in its epoch counts as processed even if its holder died before writing so.
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
            fate = "processed" if commits is not None and (d["iteration"], d["epoch"]) in commits else "pending"
            for w in d["windows"]:
                status.setdefault((d["shard"], d["data_epoch"], w), Counter())[fate] += 1
    return status
