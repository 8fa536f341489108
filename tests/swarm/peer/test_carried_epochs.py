"""The epochs notices carry are handed over in arrival order, bounded, and taken once."""

from __future__ import annotations

from swarm.control.messages import ScheduleNotice
from swarm.peer.carried_epochs import MAX_CARRIED, CarriedEpochs
from swarm.wire import ScheduleMsg
from tests.swarm.peer.test_schedule_follower import real_epoch


def test_carried_epochs_are_taken_oldest_first_once_and_only_the_newest_are_kept():
    carried = CarriedEpochs()
    carried.offer("coord", ScheduleNotice(epoch=3))  # a notice without its epoch: nothing to keep
    for epoch in range(MAX_CARRIED + 2):
        carried.offer("coord", ScheduleNotice.of(ScheduleMsg.from_schedule(real_epoch(epoch, epoch))))
    taken = carried.take()
    assert [s.epoch for s, _ in taken] == list(range(2, MAX_CARRIED + 2)) and carried.take() == []
