"""A Ctrl+C during clean-up is held until the clean-up is done, then raised."""

import os
import signal
import time

import pytest

from swarm.interrupts import deferred_interrupts


def test_sigint_waits_for_the_block_then_is_raised():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("cleaned up")
    assert done == ["cleaned up"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_an_interrupt_nothing_is_raised():
    with deferred_interrupts():
        pass
