"""`await_run_spec`: a joiner's wait for the run spec of the one coordinator it trusts; `keep_members_records`,
what its DHT learns from the spec; `UnsuitedRun`, a run this peer cannot serve."""

from __future__ import annotations

import logging
import threading
import time

from swarm.constants import DHT_TIMEOUT
from swarm.control.node import Node
from swarm.control.record_writers import RecordWriters
from swarm.control.records import SwarmRecords
from swarm.wire import RunSpec

logger = logging.getLogger(__name__)

SPEC_WAIT_NOTICE = 15.0
"""Seconds between two notices that a joiner still looks for the run spec."""


class UnsuitedRun(RuntimeError):
    """The run asks for what this peer cannot give (a relayed peer in a run averaging with hivemind's averager):
    it does not join, and says why."""


def await_run_spec(records: SwarmRecords, coordinator: str, stop: threading.Event, timeout: float, *,
                   poll: float = 0.5) -> RunSpec | None:
    """The run spec signed by `coordinator`, read from the DHT until it appears; None if `stop` is set first.
    Raises TimeoutError after `timeout` seconds, saying whose spec was looked for."""
    began = time.monotonic()
    deadline, said = began + timeout, began
    while not stop.is_set():
        spec = records.fetch_run_spec(coordinator=coordinator, timeout=DHT_TIMEOUT)
        if spec is not None:
            return spec
        now = time.monotonic()
        if now - said >= SPEC_WAIT_NOTICE:  # a joiner that waits says so, rather than look hung
            logger.info("no run spec of run %r signed by %s found yet (%.0f s); still looking", records.run_id,
                        coordinator, now - began)
            said = now
        if now >= deadline:
            raise TimeoutError(f"no run spec of run {records.run_id!r} signed by {coordinator} was found (if that "
                               "is not the run's coordinator, pass --coordinator)")
        stop.wait(poll)
    return None


def keep_members_records(node: Node, spec: RunSpec, token: str | None) -> None:
    """From now on `node`'s DHT stores and relays only the records of those run `spec` admits (as a holder of
    `token` sees them: `RecordWriters`). A protection, not a condition to join: a DHT process too loaded to answer
    in time is warned of, and the peer joins all the same (its DHT then keeps strangers' records too)."""
    try:
        node.restrict_writers(RecordWriters.of(spec, token))
    except Exception as e:
        logger.warning("could not tell this peer's DHT who run %s admits (%s: %s): it keeps strangers' records too",
                       spec.run_id, type(e).__name__, e)
