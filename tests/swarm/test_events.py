"""Typed events ride on log records: an installed EventLog writes them as JSON lines, nothing else; unknown event
names and fields are refused at the call site (and every call site of the package is read for them); a torn last
line is skipped when reading."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from swarm.events import EVENTS, EventLog, event, read_events


def test_events_of_log_records_are_written_as_json_lines_and_read_back(tmp_path):
    path = tmp_path / "peer.events.jsonl"
    log = logging.getLogger("test_events")
    root, level = logging.getLogger(), logging.getLogger().level
    root.setLevel(logging.WARNING)  # a process that logs warnings only still records its INFO events
    handler = EventLog.install(path, "peer-a")
    try:
        log.warning("moved from stage %d", 1, extra=event("moved", from_stage=1, to_stage=2, source="b",
                                                           restart=False))
        log.warning("a plain line without an event")
        log.info("loaded", extra=event("stage_loaded", stage=2, source="peer", steps=7))
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(level)
    with path.open("a") as f:
        f.write('{"time": 1e12, "event": "torn')  # a crash mid-line
    events = read_events(path, tmp_path / "missing.events.jsonl")
    assert [e["event"] for e in events] == ["moved", "stage_loaded"]
    assert events[0]["node"] == "peer-a" and events[0]["to_stage"] == 2 and events[1]["steps"] == 7


def test_an_unknown_event_name_is_refused():
    with pytest.raises(ValueError, match="unknown event 'stage_lodaed'"):
        event("stage_lodaed", stage=1)


def test_a_field_the_event_does_not_list_is_refused_and_a_missing_one_is_not():
    with pytest.raises(ValueError, match="event 'left' has no field iteraton"):
        event("left", epoch=1, iteraton=2)
    assert event("left", epoch=1)  # not every occasion has every field


def test_every_event_the_code_records_uses_only_its_listed_fields():
    """A static read of every `event("name", field=...)` call of the package: the refusal above happens only when
    the call runs, and some run only on rare paths (a stage restored from a checkpoint)."""
    root = Path(__file__).resolve().parents[2]
    calls = []
    for path in [*(root / "swarm").rglob("*.py"), *(root / "peers").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "event" and node.args and \
                    isinstance(node.args[0], ast.Constant):
                calls.append((f"{path.relative_to(root)}:{node.lineno}", node.args[0].value,
                              {k.arg for k in node.keywords if k.arg}))
    assert len(calls) > 50
    wrong = [(where, name, fields - set(EVENTS.get(name, ()))) for where, name, fields in calls
             if name not in EVENTS or fields - set(EVENTS[name])]
    assert not wrong, wrong


def test_without_an_event_log_nothing_is_written(tmp_path):
    logging.getLogger("test_events").warning("x", extra=event("left", epoch=1, iteration=2))
    assert not list(tmp_path.iterdir())
