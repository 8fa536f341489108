"""`receive_from`: a stage group member's `receive` over an in-memory queue standing in for its inbox."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any


def receive_from(box: queue.Queue) -> Callable[[float], list[Any]]:
    """`receive(timeout)`: whatever `box` holds, waiting up to `timeout` seconds for a first item ([] if none)."""
    def receive(timeout: float) -> list[Any]:
        try:
            first = box.get(timeout=timeout)
        except queue.Empty:
            return []
        out = [first]
        while not box.empty():
            out.append(box.get_nowait())
        return out
    return receive
