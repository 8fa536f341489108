"""`Traces`: the peers' measured timelines (`swarm.peer.timeline`), per iteration: each peer's compute, averaging
and idle time, and every span of one iteration for a Gantt chart.

Timeline files are `NAME.trace.jsonl` (or `trace-NN.jsonl`, as benchmarks/wan writes them) in the run directory,
one span a line: peer, kind, wall-clock start and end, and the 0-based iteration it belongs to. Metrics number
iterations from 1, so metrics iteration N is span iteration N - 1. Times are compared across peers, which holds on
one machine (one clock) and only approximately across machines.

An iteration's window runs from its first compute span (on any peer) to its last compute or averaging span; within
it a peer computes (forward, backward, loss, inject), averages its stage's gradients, or waits (idle).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarm.peer.timeline import COMPUTE_KINDS
from swarm.report.json_lines import LineCounter, read_json_lines, regular_file

MAX_TRACE_FILES = 4096
MAX_TRACE_BYTES = 4 << 30
AVERAGE = "average"
COMMIT = "commit"


@dataclass(frozen=True)
class Span:
    """One checked span of a timeline."""

    peer: str
    kind: str
    start: float
    end: float
    iteration: int | None = None
    microbatch: int | None = None
    stage: int | None = None


@dataclass(frozen=True)
class PeerTime:
    """Seconds one peer spent in the windows of the iterations it took part in."""

    compute: float
    average: float
    window: float
    iterations: int

    @property
    def idle(self) -> float:
        return max(0.0, self.window - self.compute - self.average)


@dataclass
class Traces:
    """What the timeline files of a run say (empty if the run has none)."""

    files: list[Path] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    """Peer id -> the stem of its timeline file ("peer-03")."""
    stages: dict[str, int] = field(default_factory=dict)
    """Peer id -> the stage of its last compute span."""
    warnings: list[str] = field(default_factory=list)
    _compute: dict[tuple[str, int], list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    _average: dict[tuple[str, int], list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    _seen: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    _first: dict[int, float] = field(default_factory=dict)
    """Span iteration -> start of its first compute span."""
    _last: dict[int, float] = field(default_factory=dict)
    """Span iteration -> end of its last compute or averaging span."""

    @property
    def iterations(self) -> list[int]:
        """Span iterations (0-based) with at least one compute span."""
        return sorted(self._first)

    @property
    def peers(self) -> set[str]:
        """Peers with any span of an iteration."""
        return {p for peers in self._seen.values() for p in peers}

    def peers_in(self, iteration: int) -> set[str]:
        """Peers with any span in span iteration `iteration`."""
        return set(self._seen.get(iteration, ()))

    def window(self, iteration: int) -> tuple[float, float] | None:
        """Span iteration `iteration`'s window (see the module docstring); None without compute spans."""
        if iteration not in self._first:
            return None
        return self._first[iteration], self._last[iteration]

    def peer_times(self) -> dict[str, PeerTime]:
        """Peer id -> its compute, averaging and window seconds summed over the iterations it took part in."""
        windows = {i: w for i in self.iterations if (w := self.window(i)) is not None}
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
        for i, (lo, hi) in windows.items():
            for peer in self._seen.get(i, ()):
                t = totals[peer]
                t[0] += _covered(self._compute.get((peer, i), []), lo, hi)
                t[1] += _covered(self._average.get((peer, i), []), lo, hi)
                t[2] += hi - lo
                t[3] += 1
        return {p: PeerTime(compute=t[0], average=t[1], window=t[2], iterations=int(t[3])) for p, t in totals.items()}

    def spans_of(self, iteration: int) -> list[Span]:
        """Every span of span iteration `iteration`, read again from the files (only one iteration is kept)."""
        out = []
        for path in self.files:
            try:
                for raw in read_json_lines(path, LineCounter(path)):
                    span = span_of(raw)
                    if span is not None and span.iteration == iteration:
                        out.append(span)
            except OSError:
                continue
        return sorted(out, key=lambda s: s.start)


def read_traces(root: Path) -> Traces:
    """The timelines in run directory `root`; malformed lines and unreadable files are skipped with a warning."""
    paths = {p for pattern in ("*.trace.jsonl", "trace-*.jsonl") for p in root.glob(pattern) if regular_file(p)}
    traces = Traces()
    files = sorted(paths)
    if len(files) > MAX_TRACE_FILES:
        traces.warnings.append(f"{len(files)} timeline files: only {MAX_TRACE_FILES} read")
        files = files[:MAX_TRACE_FILES]
    for path in files:
        try:
            if path.stat().st_size > MAX_TRACE_BYTES:
                traces.warnings.append(f"{path.name}: skipped, larger than {MAX_TRACE_BYTES >> 30} GiB")
                continue
            counter = LineCounter(path)
            _add_file(traces, path, counter)
        except OSError as e:
            traces.warnings.append(f"{path.name}: skipped, cannot read it ({e.strerror})")
            continue
        traces.files.append(path)
        if (w := counter.warning("malformed spans")) is not None:
            traces.warnings.append(w)
    return traces


def _add_file(traces: Traces, path: Path, counter: LineCounter) -> None:
    name = path.name.removesuffix(".jsonl").removesuffix(".trace")
    peers = set()
    for raw in read_json_lines(path, counter):
        span = span_of(raw)
        if span is None:
            counter.skipped += 1
            continue
        peers.add(span.peer)
        if span.iteration is None:
            continue
        i = span.iteration
        traces._seen[i].add(span.peer)
        if span.kind in COMPUTE_KINDS:
            traces._compute[(span.peer, i)].append((span.start, span.end))
            traces._first[i] = min(traces._first.get(i, span.start), span.start)
            if span.stage is not None:
                traces.stages[span.peer] = span.stage
        elif span.kind == AVERAGE:
            traces._average[(span.peer, i)].append((span.start, span.end))
        else:
            continue
        traces._last[i] = max(traces._last.get(i, span.end), span.end)
    if len(peers) == 1:
        traces.names.setdefault(peers.pop(), name)


def span_of(d: dict[str, Any]) -> Span | None:
    """The span of a timeline line, or None if it is malformed (missing fields, wrong types, end before start)."""
    peer, kind, start, end = d.get("peer"), d.get("kind"), d.get("start"), d.get("end")
    if not (isinstance(peer, str) and 0 < len(peer) <= 256 and isinstance(kind, str) and 0 < len(kind) <= 64):
        return None
    if not (_time(start) and _time(end) and end >= start):
        return None
    fields = {k: d.get(k) for k in ("iteration", "microbatch", "stage")}
    for v in fields.values():
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 62):
            return None
    return Span(peer=peer, kind=kind, start=float(start), end=float(end), **fields)


def _time(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and 0 <= v < 1e11


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by the union of `intervals`."""
    total, reach = 0.0, lo
    for s, e in sorted(intervals):
        s, e = max(s, reach), min(e, hi)
        if e > s:
            total += e - s
            reach = e
    return total
