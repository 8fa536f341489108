"""Typed events: what a peer or the coordinator did, as JSON lines that tests and tools read instead of log text.

An event rides on a log record: ``logger.warning("...", ..., extra=event("stage_loaded", stage=2, source="peer"))``
writes the human line as before and, where the process installed an `EventLog` (`--events FILE`), one JSON line
``{"time": ..., "node": ..., "event": "stage_loaded", "stage": 2, "source": "peer"}``. Event names are the
`EVENTS` below, each with the fields it may carry (not every occasion has each); `event` refuses any other name or
field, so a test can rely on them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

EVENTS: dict[str, tuple[str, ...]] = {
    # a peer's stage
    "placed": ("stage", "epoch", "iteration", "seconds", "laps"),  # the first: seconds since its start, by step
    "joined": ("seconds", "laps"),  # admitted, linked and announced: seconds since its start, by step (`JoinLaps`)
    # source: "peer" (a same-stage peer's state), "handover" (the peer it replaces), "checkpoint" (its own),
    # "blocks" (a neighbouring stage's decoder blocks, from_stage) or "own_blocks" (its old stage's, after a move);
    # iteration: the checkpoint's
    "stage_loaded": ("stage", "source", "peer", "steps", "from_stage", "iteration"),
    "moved": ("from_stage", "to_stage", "source", "restart"),
    # a joiner could not take its placement up: its stage's state did not come (it leaves the placement and asks
    # to be placed again), or a newer epoch placed it otherwise (`revised`: it starts on that one)
    "join_abandoned": ("stage", "epoch", "why", "revised"),
    "state_sent": ("stage", "to", "why", "delivered"),
    "left": ("epoch", "iteration"),
    "stopped": ("iteration", "why"),  # why: run finished, scheduler silent, asked to stop, iterations done
    "param_digest": ("iteration", "stage", "digest"),
    "averaging_failed": ("group", "why"),
    "averaging_partial": ("group", "received"),  # received: fraction of the group mean that arrived
    # hivemind: a stage group's members averaged their whole state (after a partial round, or a member's drift)
    "state_resynced": ("stage", "members", "received"),
    # all-gather: this copy's lineage differed from its group's (a round some members averaged without a member
    # that reached the others); it took the holders' state (`loaded`), or their state did not come
    "stage_mended": ("stage", "iteration", "loaded", "holders"),
    "scheduler_changed": ("previous", "scheduler"),
    "scheduler_role_returned": ("scheduler",),
    # a peer's pipeline
    "detoured": ("microbatch", "gone", "to", "to_stage"),
    "microbatch_broken": ("microbatch", "attempt", "why"),
    # a relay took these microbatches of holders the commit left out back out of its gradient
    "unlearnt": ("iteration", "microbatches"),
    # its sends to `peer` ran far off the link's estimate: re-measured ([latency s, bytes/s] before and after)
    "link_remeasured": ("peer", "was", "now"),
    # a relay reported this holder's microbatch broken at `accused`, which then served its next attempt
    "report_disproved": ("reporter", "accused", "microbatch"),
    # what a peer refused
    "refused_message": ("sender", "why"),
    "dropped_message": ("sender", "microbatch", "why"),
    "activation_refused": ("sender", "microbatch", "why"),
    "ignored_control": ("sender", "kind", "why"),
    "ignored_record": ("signer", "kind", "why"),
    # why: "refused: ..." (left out of the stage mean), "weight cut: ..." or "clipped by CenteredClip"
    "gradient_refused": ("stage", "iteration", "sender", "why"),
    # averaging by parts: the two owners' means of a part differ (it goes to the fallback)
    "part_disputed": ("stage", "iteration", "part", "owners"),
    "state_refused": ("stage", "sender", "why"),
    # the scheduler; epoch: the newest one when it re-planned (the plan, once published, is the next)
    "replanned": ("epoch", "start_iteration", "gone", "leaving", "joining"),
    # a re-plan made off the scheduler's loop starts later than asked: iterations committed while it was made
    # (why "committed"), or its store would have held the commit of the iteration in progress ("store")
    "plan_rebased": ("epoch", "start_iteration", "asked", "why"),
    # pings to much of the swarm went unanswered at once: put down to the scheduler's own silence, asked again once
    "pings_repeated": ("peers", "silent", "placed"),
    # a scheduler that found the run gone on under a successor while it was away (`Overtaking`)
    "scheduler_stood_down": ("iteration",),
    "joiner_placed": ("peer", "stage"),
    "shard_moved": ("shard", "source", "to"),
    "peer_moved": ("peer", "from_stage", "to_stage", "source", "why"),
    "stage_emptied": ("stages",),
    # witness: what corroborated it (reporters, ping, heartbeat, broken, faulty: `swarm.coordinator.liveness`)
    "declared_gone": ("peer", "why", "witness"),
    "taken_back": ("peer", "why"),
    # holders late against the others' median report, left out of an iteration's commit (not taken for gone)
    "holders_excused": ("iteration", "epoch", "peers", "seconds"),
    # a holder the commits showed slow (or on time again) injects `microbatches` instead of `was` from an iteration on
    "holder_share": ("peer", "share", "microbatches", "was", "start_iteration"),
    "holder_benched": ("peer", "seconds", "iteration"),
    # a relay whose own passes stayed far slower than the other relays' (`Pace` reports) is taken off the run's work
    "relay_benched": ("peer", "seconds", "iteration"),
    "benched": ("iteration", "seconds"),
    # placed peers whose measured slowdown (peer -> measured) or hops whose message time ("a->b" -> seconds) drifted
    # from the plan's: paths re-planned on the same placement from `start_iteration` if that made them `gain`
    # quicker (`replanned`), else left as they were
    "costs_drifted": ("peers", "links", "gain", "replanned", "start_iteration"),
    # two members of one stage group cannot reach each other: `peer` sits out `seconds` (`partner` keeps serving)
    "estranged": ("peer", "partner", "stage", "seconds"),
    # admission: the scheduler's decisions, and a joiner told it is not admitted
    "admitted": ("peer",),
    "refused_peer": ("peer", "why"),
    # reachability (`swarm.net.reachability`): a peer's own verdict; the coordinator's dial-back of a member that
    # took no connection (logged by the coordinator with `peer`, by the peer told with `relay` and `advice`)
    "reachability": ("reachability", "advice"),
    "not_dialable": ("peer", "tried", "relay", "advice"),
    # a `--reachability auto` peer found undialable by a relaying coordinator leaves, and its process restarts so
    "restarting": ("reachability",),
    # a node's p2p daemon did not start (try `attempt`): it is started again (`swarm.control.node`)
    "dht_start_failed": ("attempt", "error"),
    # a record's store did not answer within `seconds` (it is read back): a loaded host or DHT; benchmarks count them
    # to tell a loaded machine's runs from a quiet one's
    "record_store_slow": ("kind", "seconds"),
}
"""Event name -> its fields (an event may carry fewer, or extra context; never another name)."""

EVENT_ATTR = "skippipe_event"


def event(name: str, **fields: Any) -> dict[str, Any]:
    """The `extra` of a log call that also records event `name` with `fields`; raises ValueError for an unknown
    name or a field its `EVENTS` entry does not list (a typo would make the event, or the field, invisible to
    whoever waits for it)."""
    if name not in EVENTS:
        raise ValueError(f"unknown event {name!r}; add it to swarm.events.EVENTS")
    if unknown := set(fields) - set(EVENTS[name]):
        raise ValueError(f"event {name!r} has no field {', '.join(sorted(unknown))}; add it to swarm.events.EVENTS")
    return {EVENT_ATTR: {"event": name, **fields}}


class EventLog(logging.Handler):
    """Appends the events of the log records it sees to `path`, one JSON object a line, flushed at once.

    :param node: this process's peer id, in every line
    """

    def __init__(self, path: str | Path, node: str) -> None:
        super().__init__(level=logging.DEBUG)
        self.path, self.node = Path(path), node
        self._file = self.path.open("a", buffering=1)
        self._write = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        data = getattr(record, EVENT_ATTR, None)
        if data is None:
            return
        line = json.dumps({"time": round(time.time(), 3), "node": self.node, **data}, default=str)
        with self._write:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._write:
            self._file.close()
        super().close()

    @classmethod
    def install(cls, path: str | Path | None, node: str) -> EventLog | None:
        """Record this process's events in `path` (None: nowhere) from now on."""
        if path is None:
            return None
        root = logging.getLogger()
        if root.getEffectiveLevel() > logging.INFO:  # events are INFO and up, whatever the log shows
            for existing in root.handlers:
                existing.setLevel(max(existing.level, root.getEffectiveLevel()))
            root.setLevel(logging.INFO)
        handler = cls(path, node)
        root.addHandler(handler)
        return handler


def read_events(*paths: str | Path) -> list[dict[str, Any]]:
    """The events in `paths` (missing files count as empty), oldest first; a torn last line is skipped."""
    out = []
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return sorted(out, key=lambda e: e.get("time", 0.0))
