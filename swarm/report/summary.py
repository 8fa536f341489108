"""`summarize`: the report's summary table, as (label, value) rows of plain text.

Membership comes from the typed events when the run recorded them: peers that left gracefully (`left`), peers the
scheduler took for gone (`declared_gone`, and the `gone` list of each `replanned`), peers that joined mid-run.
"""

from __future__ import annotations

import statistics
from typing import Any

from swarm.report.run_dir import RunData
from swarm.report.traces import Traces

MAX_LISTED = 12
"""Peers named in one cell at most (the rest are counted)."""


def summarize(run: RunData, traces: Traces) -> list[tuple[str, str]]:
    """The summary rows of `run` (every value already a string)."""
    latest = run.schedules[max(run.schedules)] if run.schedules else None
    first, last = run.metrics[0], run.metrics[-1]
    rows = [
        ("run id", run.run_id or "not recorded"),
        ("model", run.model or "not recorded (no run.toml in the run directory)"),
        ("stages", _stages(latest) if latest is not None else "unknown (no schedule-N.json)"),
        ("peers seen", _peers_seen(run, traces)),
        ("iterations", _iterations(run)),
        ("final loss", _final_loss(run) + f" (first {first.loss:.4f})"),
        ("median tokens/s", _median_tokens(run)),
        ("median iteration time", _median_times(run)),
        ("schedule epochs", _epochs(run)),
        ("peers that left", _names(run, _left(run.events))),
        ("peers declared gone", _names(run, _gone(run.events))),
        ("peers that joined mid-run", _names(run, _joined(run.events))),
    ]
    if last.peers_online is not None:
        rows.insert(4, ("peers online at the end", str(last.peers_online)))
    return rows


def _stages(schedule) -> str:
    rules = schedule.rules
    return f"{rules.num_stages} ({rules.stages_per_path} per path, skip ratio {rules.skip_ratio:.2f})"


def _peers_seen(run: RunData, traces: Traces) -> str:
    placed = {p for s in run.schedules.values() for p in s.placement}
    traced = traces.peers
    if not placed:
        return f"{len(traced)} (from timelines)" if traced else "unknown"
    return f"{len(placed)} placed in a schedule" + (f", {len(traced)} with timelines" if traced else "")


def _iterations(run: RunData) -> str:
    its = [r.iteration for r in run.metrics]
    missing = its[-1] - its[0] + 1 - len(its)
    text = f"{len(its)} ({its[0]}–{its[-1]})"
    return text + (f", {missing} missing from metrics.jsonl" if missing else "")


def _final_loss(run: RunData) -> str:
    last = run.metrics[-1]
    text = f"{last.loss:.4f} at iteration {last.iteration}"
    val = [r for r in run.metrics if r.val_loss is not None]
    return text + (f"; validation {val[-1].val_loss:.4f} at iteration {val[-1].iteration}" if val else "")


def _median_tokens(run: RunData) -> str:
    values = [r.tokens_per_s for r in run.metrics if r.tokens_per_s is not None]
    return f"{statistics.median(values):,.0f}" if values else "not recorded"


def _median_times(run: RunData) -> str:
    measured = [r.seconds for r in run.metrics if r.seconds is not None]
    planned = [p for r in run.metrics if (p := run.planned_seconds(r.epoch)) is not None]
    if not measured:
        return "not recorded"
    text = f"{statistics.median(measured):.3f} s measured"
    if planned:
        m, p = statistics.median(measured), statistics.median(planned)
        text += f", {p:.3f} s planned" + (f" (measured {m / p:.2f}× planned)" if p > 0 else "")
    return text


def _epochs(run: RunData) -> str:
    used = sorted({r.epoch for r in run.metrics if r.epoch is not None})
    replans = [e for e in run.events if e["event"] == "replanned"]
    text = f"{len(run.schedules)} published" if run.schedules else "no schedule files"
    if used:
        text += f"; iterations ran under {len(used)} (epochs {', '.join(map(str, used[:MAX_LISTED]))}" + \
                ("…)" if len(used) > MAX_LISTED else ")")
    if replans:
        text += f"; {len(replans)} re-plan{'s' if len(replans) > 1 else ''} on membership changes"
    return text


def _left(events: list[dict[str, Any]]) -> list[str]:
    return _unique(e["node"] for e in events if e["event"] == "left")


def _gone(events: list[dict[str, Any]]) -> list[str]:
    out = [e.get("peer") for e in events if e["event"] == "declared_gone"]
    out += [p for e in events if e["event"] == "replanned" and isinstance(e.get("gone"), list) for p in e["gone"]]
    return _unique(out)


def _joined(events: list[dict[str, Any]]) -> list[str]:
    return _unique(p for e in events if e["event"] == "replanned" and isinstance(e.get("joining"), list)
                   for p in e["joining"])


def _unique(peers) -> list[str]:
    return list(dict.fromkeys(p for p in peers if isinstance(p, str) and 0 < len(p) <= 256))


def _names(run: RunData, peers: list[str]) -> str:
    if not run.events:
        return "unknown (no events recorded)"
    if not peers:
        return "none"
    names = [run.name(p) for p in peers[:MAX_LISTED]]
    more = len(peers) - len(names)
    return ", ".join(names) + (f" and {more} more" if more else "")
