"""A Ctrl+C during clean-up is held until the clean-up is done, then handled as it would have been."""

import os
import signal
import time

import pytest

from swarm.local.interrupts import deferred_interrupts


@pytest.fixture
def sigint_handler():
    """Run with a known SIGINT handler (a shell may start the tests with SIGINT ignored), restored afterwards."""
    before = signal.getsignal(signal.SIGINT)
    yield lambda handler: signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGINT, before)


def test_sigint_waits_for_the_block_then_is_raised(sigint_handler):
    sigint_handler(signal.default_int_handler)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("cleaned up")
    assert done == ["cleaned up"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_sigint_stays_ignored(sigint_handler):
    sigint_handler(signal.SIG_IGN)
    with deferred_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_without_an_interrupt_nothing_is_raised():
    with deferred_interrupts():
        pass
