"""`await_run_spec`: a joiner's wait for the run spec of the one coordinator it trusts; `UnsuitedRun`, a run this
peer cannot serve."""

from __future__ import annotations

import threading
import time

from swarm.constants import DHT_TIMEOUT
from swarm.control.records import SwarmRecords
from swarm.wire import RunSpec


class UnsuitedRun(RuntimeError):
    """The run asks for what this peer cannot give (a relayed peer in a run averaging with hivemind's averager):
    it does not join, and says why."""


def await_run_spec(records: SwarmRecords, coordinator: str, stop: threading.Event, timeout: float, *,
                   poll: float = 0.5) -> RunSpec | None:
    """The run spec signed by `coordinator`, read from the DHT until it appears; None if `stop` is set first.
    Raises TimeoutError after `timeout` seconds, saying whose spec was looked for."""
    deadline = time.monotonic() + timeout
    while not stop.is_set():
        spec = records.fetch_run_spec(coordinator=coordinator, timeout=DHT_TIMEOUT)
        if spec is not None:
            return spec
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no run spec of run {records.run_id!r} signed by {coordinator} was found (if that "
                               "is not the run's coordinator, pass --coordinator)")
        stop.wait(poll)
    return None
