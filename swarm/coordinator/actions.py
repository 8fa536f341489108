"""What the scheduler asks its owner to do (`Scheduler` decides, `SchedulerRole` carries out): make a plan off its
loop, publish a schedule epoch, gossip a control message, record an iteration's metrics."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.schedule import Schedule
from swarm.control.messages import ControlMessage, ScheduleNotice
from swarm.coordinator.plan_job import PlanJob


@dataclass(frozen=True)
class MakePlan:
    """Run `job` (`PlanJob.run`) off the loop and hand it back to `Scheduler.planned` on it."""

    job: PlanJob


@dataclass(frozen=True)
class PublishSchedule:
    """Gossip `notice` and store `schedule` in the DHT (the scheduler already counts it as published; tell it whether
    it was stored: `Scheduler.stored`); with `bridge`, the epoch in force until it starts (see `ScheduleMsg.bridge`).
    A notice that carries the epoch goes at once (the peers take the epoch from it); one that does not, once the
    store is done (the peers read the epoch from the DHT at the notice)."""

    schedule: Schedule
    bridge: Schedule | None
    notice: ScheduleNotice


@dataclass(frozen=True)
class Announce:
    """Gossip `message` to the run."""

    message: ControlMessage


@dataclass(frozen=True)
class RecordIteration:
    """An iteration was committed: log and store its metrics line. It comes before the commit's announcement (a
    write-ahead log): a scheduler killed between the two leaves a record its successor supersedes when it runs the
    iteration again (`committed_records`); the other order would leave a commit the peers acted on unrecorded."""

    record: dict


Action = MakePlan | PublishSchedule | Announce | RecordIteration
