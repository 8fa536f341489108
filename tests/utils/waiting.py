"""`wait_for`: poll a condition of a multi-process test until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.2) -> T:
    """The first truthy value of `predicate()`; raises TimeoutError naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(what)
