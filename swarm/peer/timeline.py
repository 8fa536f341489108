"""`Timeline`: what one peer did and when (compute and transfers), and the Chrome trace of a whole swarm.

Each peer appends its spans (forward, backward, loss, send, ...) as JSON lines to its own file, one flush per
iteration, with wall-clock times: on one machine the peers share a clock, so `chrome_trace` can lay every
peer's spans on one time axis. The trace opens in Perfetto (ui.perfetto.dev) or chrome://tracing: one row
group per peer, with rows for its compute, its sends and its waits (commit, averaging).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

COMPUTE_KINDS = ("inject", "forward", "loss", "backward")
ROWS = ("compute", "send", "sync")
"""Rows of a peer in the trace: its operations, its outgoing transfers, its waits for commit and averaging."""


def row_of(kind: str) -> int:
    return 0 if kind in COMPUTE_KINDS else 1 if kind.startswith("send_") else 2


class Timeline:
    """Spans of one peer, kept in memory until `flush` appends them to `path` (thread-safe: senders record too)."""

    def __init__(self, path: str | Path | None, *, peer: str) -> None:
        self.path = Path(path) if path else None
        self.peer = peer
        self._spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._compute: tuple[int, int, float] = (0, 0, 0.0)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def record(self, kind: str, start: float, end: float, **args: Any) -> None:
        """One span: `kind` (e.g. "forward"), wall-clock `start`/`end` in seconds, free-form `args`. Compute spans
        are counted even without a trace file (see `take_compute`)."""
        if kind in COMPUTE_KINDS:
            forwards, backwards, seconds = self._compute
            self._compute = (forwards + (kind in ("inject", "forward")), backwards + (kind == "backward"),
                             seconds + max(0.0, end - start))
        if self.path is None:
            return
        with self._lock:
            self._spans.append({"peer": self.peer, "kind": kind, "start": start, "end": end, **args})

    def compute_so_far(self) -> tuple[int, int, float]:
        """(forward passes, backward passes, compute seconds) recorded since the last `take_compute`."""
        return self._compute

    def take_compute(self) -> tuple[int, int, float]:
        """(forward passes, backward passes, compute seconds) recorded since the last call, which resets them."""
        taken, self._compute = self._compute, (0, 0, 0.0)
        return taken

    def flush(self) -> None:
        if self.path is None:
            return
        with self._lock:
            spans, self._spans = self._spans, []
        if spans:
            with self.path.open("a") as f:
                f.writelines(json.dumps(s) + "\n" for s in spans)


def read_spans(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every span in the timeline files that exist (a torn last line, from a killed peer, is skipped)."""
    spans = []
    for path in paths:
        p = Path(path)
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            try:
                span = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(span, dict) and {"peer", "kind", "start", "end"} <= set(span):
                spans.append(span)
    return spans


def chrome_trace(spans: Iterable[Mapping[str, Any]], labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Chrome trace-event JSON of `spans` (times relative to the earliest span, in microseconds).

    :param labels: peer id -> row-group name (e.g. "peer-03, stage 2"); default: the peer id
    """
    spans = sorted(spans, key=lambda s: s["start"])
    labels = labels or {}
    t0 = spans[0]["start"] if spans else 0.0
    pids = {peer: i for i, peer in enumerate(sorted({s["peer"] for s in spans}, key=lambda p: labels.get(p, p)))}
    events: list[dict[str, Any]] = []
    for peer, pid in pids.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": labels.get(peer, peer)}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        for tid, row in enumerate(ROWS):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": row}})
    for s in spans:
        args = {k: v for k, v in s.items() if k not in ("peer", "kind", "start", "end")}
        mb = args.get("microbatch")
        events.append({
            "name": s["kind"] if mb is None else f"{s['kind']} mb{mb}",
            "cat": s["kind"], "ph": "X", "pid": pids[s["peer"]], "tid": row_of(s["kind"]),
            "ts": round((s["start"] - t0) * 1e6, 1), "dur": round(max(0.0, s["end"] - s["start"]) * 1e6, 1),
            "args": args,
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}
