"""`frozen_host`: a local swarm's peer frozen with its whole process tree for a block (a host that dies silently)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psutil

from swarm.local.local_swarm import LocalSwarm, Started
from tests.utils.waiting import wait_for


@contextlib.contextmanager
def frozen_host(swarm: LocalSwarm, proc: Started) -> Iterator[list[psutil.Process]]:
    """SIGSTOP `proc`'s whole tree (`LocalSwarm.freeze`) and wait until every process shows stopped (SIGSTOP is
    delivered asynchronously); yields the stopped processes. Afterwards, whatever happened: SIGCONT, then the whole
    tree is killed (`LocalSwarm.stop` would kill the peer but not its stopped helpers)."""
    tree = swarm.freeze(proc)
    try:
        wait_for(lambda: {p.status() for p in tree} == {psutil.STATUS_STOPPED}, 10, "the whole tree stopped")
        yield tree
    finally:
        for p in tree:
            try:
                p.resume()
            except psutil.NoSuchProcess:
                pass
        swarm.kill(proc)
