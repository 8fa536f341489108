"""A peer's inbox sorts messages by iteration and kind, holds a newer epoch's until the peer adopts it, and is
bounded: a full inbox makes the transport's consumer (and so the senders) wait. The outbox is bounded too, hands a
pipeline message it could not deliver back to the inbox, and sends stage state to each receiver in order while a
slow receiver holds up no other."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import torch

from swarm.constants import INBOX_SIZE, OUTBOX_SIZE
from swarm.net.delivery import Inbound, Undelivered
from swarm.peer.attempts import Requeue
from swarm.peer.mailbox import MAX_ITERATIONS_AHEAD, Inbox, Outbox, all_delivered
from swarm.peer.timeline import Timeline
from swarm.wire import Direction, HopHeader


def message(iteration: int, direction: Direction = Direction.FORWARD, epoch: int = 0, sender: str = "b",
            microbatch: int = 0) -> Inbound:
    header = HopHeader(run="r", iteration=iteration, microbatch=microbatch, route=("a", "b"), hop=1,
                       direction=direction, epoch=epoch, dtype="", shape=())
    return Inbound(sender, header, torch.zeros(1))


def test_messages_are_sorted_by_iteration_and_kind():
    inbox = Inbox()
    inbox.adopt(0)
    for m in (message(0), message(1), message(0, Direction.BACKWARD), message(MAX_ITERATIONS_AHEAD + 1)):
        inbox.put(m)
    inbox.put(message(0, Direction.AVERAGE), "average")
    inbox.put(message(0, Direction.STATE), "state")
    hops = inbox.receive("hop", 0.1)
    assert [m.header.direction for m in hops] == [Direction.FORWARD, Direction.BACKWARD]
    assert [m.header.direction for m in inbox.receive("average", 0.0)] == [Direction.AVERAGE]
    assert [m.header.direction for m in inbox.receive("state", 0.0, any_iteration=True)] == [Direction.STATE]
    inbox.iteration = 1
    assert [m.header.iteration for m in inbox.receive("hop", 0.0)] == [1]  # the one too far ahead was refused
    inbox.iteration = MAX_ITERATIONS_AHEAD + 1
    assert inbox.receive("hop", 0.0) == []


def test_a_newer_epochs_messages_are_held_until_the_peer_adopts_it_and_older_ones_are_void():
    inbox = Inbox()
    inbox.adopt(0)
    inbox.iteration = 3
    inbox.hold(message(3, epoch=1, microbatch=5))  # its sender switched first
    inbox.put(message(4, epoch=0, microbatch=6))  # for the next iteration, under the old epoch
    assert inbox.receive("hop", 0.1) == [] and inbox.newest_epoch == 1
    inbox.adopt(1)
    assert [m.header.microbatch for m in inbox.receive("hop", 0.0)] == [5]
    inbox.iteration = 4
    assert inbox.receive("hop", 0.0) == []  # epoch 0's message is void


def test_a_new_epoch_voids_the_older_epochs_re_queue_reports_with_its_messages():
    """A re-queue report filed under epoch 0 is void once the peer adopts epoch 1, as epoch 0's messages are (adopting
    the epoch used to fail on it: a report carries its epoch, not a message header); one of epoch 1 is kept."""
    inbox = Inbox()
    inbox.adopt(0)
    inbox.iteration = 3
    inbox.signal(Requeue(iteration=3, epoch=0, microbatch=1, attempt=0, gone="x"))
    inbox.put(message(3, epoch=0, microbatch=2))
    assert inbox.receive("average", 0.0) == []  # both filed with the iteration's hops
    inbox.adopt(1)
    inbox.signal(Requeue(iteration=3, epoch=1, microbatch=3, attempt=0, gone="x"))
    assert [m.microbatch for m in inbox.receive("hop", 0.0)] == [3]


def test_a_fresh_joiner_keeps_the_messages_of_an_epoch_that_reruns_the_iteration_before():
    inbox = Inbox()
    inbox.adopt(0)
    inbox.iteration = 3  # placed from iteration 3
    inbox.put(message(2, epoch=1, microbatch=7))  # epoch 1 reruns iteration 2, with this peer
    assert inbox.receive("hop", 0.1) == []
    inbox.iteration = 2  # the peer goes back to the rerun's start before adopting it
    inbox.adopt(1)
    assert [m.header.microbatch for m in inbox.receive("hop", 0.0)] == [7]


def test_a_full_inbox_makes_the_transport_wait_until_the_peer_catches_up_and_holds_up_no_other_kind():
    inbox = Inbox()
    inbox.adopt(0)
    for i in range(INBOX_SIZE):
        inbox.put(message(0, microbatch=i))
    extra = threading.Thread(target=inbox.put, args=(message(0, microbatch=INBOX_SIZE),))
    extra.start()
    time.sleep(0.3)
    assert extra.is_alive()  # the transport's consumer waits: its own queue fills, then the senders wait
    inbox.wake()  # a wake-up never waits, even on a full inbox
    inbox.put(message(0, Direction.AVERAGE), "average")  # another channel is not held up
    assert len(inbox.receive("average", 0.1)) == 1
    assert len(inbox.receive("hop", 0.1)) >= INBOX_SIZE
    extra.join(timeout=5)
    assert not extra.is_alive()


def test_an_undelivered_pipeline_message_comes_back_and_the_outbox_is_bounded(tmp_path):
    inbox, failed = Inbox(), []
    inbox.adopt(0)
    outbox = Outbox(lambda: None, inbox, Timeline(None, peer="a"), failed=lambda peer, certain: failed.append(peer))
    try:
        assert outbox.send("b", message(0).header, torch.zeros(4)).result(timeout=5) is False
        (back,) = inbox.receive("hop", 1.0)
        assert isinstance(back, Undelivered) and back.peer == "b" and failed == ["b"]
        # a courtesy copy (`report=False`: a stage mate the commit left out) fails without a word to `failed`
        assert outbox.send("c", message(0).header, torch.zeros(4), report=False).result(timeout=5) is False
        assert failed == ["b"]
        inbox.receive("hop", 1.0)
        release, started = threading.Event(), []

        def job() -> bool:
            started.append(1)
            return release.wait(10)

        for _ in range(OUTBOX_SIZE):
            outbox.submit(job)
        blocked = threading.Thread(target=outbox.submit, args=(job,))
        blocked.start()
        time.sleep(0.3)
        assert blocked.is_alive()  # a peer with OUTBOX_SIZE sends pending waits before queueing another
        release.set()
        blocked.join(timeout=10)
        assert not blocked.is_alive()
    finally:
        outbox.shutdown()


def test_state_goes_to_each_receiver_in_order_and_a_slow_one_holds_up_no_other():
    outbox = Outbox(lambda: None, Inbox(), Timeline(None, peer="a"))
    release, ran = threading.Event(), []

    def job(name: str, wait: bool = False):
        def run() -> bool:
            ran.append(name)
            return release.wait(10) if wait else True
        return run

    try:
        slow = [outbox.submit(job("slow-1", wait=True), "state", lane="slow"),
                outbox.submit(job("slow-2"), "state", lane="slow")]
        time.sleep(0.2)
        fast = [outbox.submit(job(f"fast-{i}"), "state", lane="fast") for i in range(3)]
        assert all(f.result(timeout=5) for f in fast)  # while the slow receiver's first part is still out
        assert ran == ["slow-1", "fast-0", "fast-1", "fast-2"]  # its second part waits behind its first
        assert not slow[1].done()
        release.set()
        assert all(f.result(timeout=5) for f in slow) and ran[-1] == "slow-2"
        again = outbox.submit(job("slow-3"), "state", lane="slow")  # an emptied lane starts anew
        assert again.result(timeout=5) and ran[-1] == "slow-3"
    finally:
        release.set()
        outbox.shutdown()


def test_a_wake_up_ends_the_wait_for_pipeline_messages_at_once():
    inbox = Inbox()
    inbox.adopt(0)
    threading.Timer(0.2, inbox.wake).start()  # e.g. the scheduler's commit came in
    start = time.monotonic()
    assert inbox.receive("hop", 5.0) == []
    assert time.monotonic() - start < 2.0
    inbox.wake()  # a wake-up is for the pipeline loop: averaging waits on
    start = time.monotonic()
    assert inbox.receive("average", 0.3) == [] and time.monotonic() - start >= 0.3
    assert inbox.receive("hop", 5.0) == [] and time.monotonic() - start < 2.0  # still pending for the hop loop


def test_a_joiner_holds_what_comes_before_its_placement_and_files_it_at_its_start_iteration():
    inbox = Inbox()  # nothing adopted: the peer waits to be placed
    inbox.put(message(21, Direction.AVERAGE, epoch=2), "average")  # its stage mate heard of epoch 2 first
    inbox.put(message(21, epoch=2, microbatch=4))
    assert inbox.receive("average", 0.05) == [] and inbox.newest_epoch == 2
    inbox.iteration = 21  # placed from iteration 21 by epoch 2
    inbox.adopt(2)
    assert [m.header.direction for m in inbox.receive("average", 0.0)] == [Direction.AVERAGE]
    assert [m.header.microbatch for m in inbox.receive("hop", 0.0)] == [4]


def test_a_message_sent_in_pieces_is_delivered_once_every_piece_is_and_not_if_one_fails():
    pieces = [Future() for _ in range(3)]
    whole = all_delivered(pieces)
    pieces[0].set_result(True)
    pieces[2].set_result(True)
    assert not whole.done()
    pieces[1].set_result(True)
    assert whole.result(timeout=1) is True
    pieces = [Future() for _ in range(3)]
    whole = all_delivered(pieces)
    pieces[1].set_result(False)  # one piece lost: the message was not delivered, whatever the others do
    assert whole.result(timeout=1) is False
    pieces[0].set_result(True)
    pieces[2].set_exception(RuntimeError("shut down"))
    assert whole.result() is False
