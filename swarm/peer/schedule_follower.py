"""`ScheduleFollower`: which schedule epoch a peer follows, and what its scheduler has told it.

The scheduler announces each epoch on gossip, its notice carrying it (`ScheduleNotice.schedule`), and stores it in the
DHT: the follower takes the epoch a notice carries at the next look, without waiting for the DHT (a store took 3-7 s on
a loaded 20-peer host, and every peer waited for it at the epoch's start). It reads the DHT on a notice, again every
half second while a newer epoch is known to exist but neither a notice nor the DHT brought it (a notice lost, one too
large to carry its epoch, replicas that lag) or while this peer awaits the replacement of an iteration it reported
unable to finish, and every SCHEDULE_POLL_PERIOD in any case. Those reads run on a thread of their own, and what one
found is taken at the next look: the pipeline loop looks between operations, and a read waits on every DHT node it asks
(up to hivemind's RPC timeout on a frozen one), which held that loop, and with it the check for late backwards, up to
seconds at a silent death. An epoch starts at an iteration (`start_iteration`): until then it waits as
`newer`; one that starts at or before the iteration in progress replaces it (a rerun). The DHT holds only the newest
epoch: one that started at the iteration in progress and was replaced there by a later-starting one comes along with
it as its `bridge` (`ScheduleMsg.bridge`), and runs from its start until the newest starts. The follower keeps
every bridge it read that has not started (`known.bridges`): a peer an iteration behind may read epoch 8 bridging
to 7, then epoch 9 bridging to 8, and still needs 7 for the iteration it is on.

Only the scheduler is trusted: schedules are read from the DHT signed by the coordinator or the current scheduler, and
notices (with the epochs they carry), 'gone', 'finished' and commits are taken only from the scheduler or, once it has
missed a heartbeat, from its would-be successor (`Succession` keeps `scheduler` and `candidate` current). The scheduler
is alive while its DHT record is read or its gossip brings news: a commit, a newer epoch, a beat (`Alive`, every
heartbeat). A peer that moved on to a successor follows the coordinator again at its news.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from scheduler.schedule import Schedule
from swarm.constants import DHT_TIMEOUT, silent_after
from swarm.control.messages import Alive, Commit, ControlMessage, Finished, Gone, ScheduleNotice
from swarm.control.records import SwarmRecords
from swarm.events import event
from swarm.peer.carried_epochs import CarriedEpochs, Found

logger = logging.getLogger(__name__)

MAX_BEATING = 4
"""Senders whose beats' sequence numbers a follower keeps (the coordinator and the schedulers it followed last)."""
SCHEDULE_POLL_PERIOD = 5.0
"""Seconds between two reads of the newest schedule from the DHT when no notice came."""
LAGGING_POLL_PERIOD = 0.5
"""Seconds between two reads while a newer epoch is known to exist but the DHT still returns an older one."""
PLACEMENT_POLL_PERIOD = 2.0
"""Seconds between two reads while a peer waits to be placed and no notice came. A notice wakes it at once, then
it reads every LAGGING_POLL_PERIOD for NOTICE_FOLLOW_UP seconds (the DHT's replicas may lag the notice). Each read
is a DHT lookup and every joiner waits at once: 8 waiting peers that read every 0.5 s instead kept an idle swarm at
1.27 cores rather than 1.15 (BENCHMARKS.md, "Where a local swarm's CPU goes")."""
COMMIT_WAIT = 30.0
"""Seconds a holder placed from the iteration after the one in progress waits for that iteration's commit (it
normally comes before the stage's state, which the veterans send after that commit)."""
NOTICE_FOLLOW_UP = 5.0
"""Seconds after a notice during which a waiting peer reads every LAGGING_POLL_PERIOD."""
DELIVERY_LOOK = 0.05
"""Seconds between two looks for a carried epoch or a finished read while one is waited for."""
ANNOUNCED_READ_WAIT = DHT_TIMEOUT
"""Seconds `due` waits for a read under way when a newer epoch is known to exist, as long as a read may take: an
iteration started under the old epoch is refused by the peers that took the new one (their checks know no older
epoch), so that holder's attempts all break. This is how long the synchronous read it replaces could block at that
point."""


class Known(NamedTuple):
    """The epochs a peer knows, replaced whole (never mutated): other threads (the inbound checks, a successor)
    read one snapshot, so they never see an epoch in use or pending vanish between two reads while it is taken."""
    in_use: Schedule | None = None
    bridges: tuple[Schedule, ...] = ()
    newer: Schedule | None = None

    @property
    def all(self) -> tuple[Schedule, ...]:
        """The epoch in use, then those pending, oldest first."""
        return ((self.in_use,) if self.in_use is not None else ()) + self.bridges + \
            ((self.newer,) if self.newer is not None else ())

    def past(self, epoch: int) -> Known:
        """The same epoch in use, with only the pending epochs newer than `epoch`."""
        newer = self.newer if self.newer is not None and self.newer.epoch > epoch else None
        return Known(self.in_use, tuple(b for b in self.bridges if b.epoch > epoch), newer)




class ScheduleRead:
    """One read of the newest schedule (and its bridge), on a daemon thread: a read stuck on the DHT must not hold
    its caller. `result` is what `fetch` returned, or None if it failed."""

    def __init__(self, fetch: Callable[[], Found | None]) -> None:
        self.done = threading.Event()
        self.result: Found | None = None
        threading.Thread(target=self._run, args=(fetch,), name="skippipe-schedule-read", daemon=True).start()

    def _run(self, fetch: Callable[[], Found | None]) -> None:
        try:
            self.result = fetch()
        except Exception as e:  # a timeout, a daemon hiccup, a malformed record: the next look reads again
            logger.warning("could not read the schedule from the DHT: %s: %s", type(e).__name__, e)
        finally:
            self.done.set()


class ScheduleFollower:
    """The schedule in use, the next one, and the scheduler's notices.

    :param records: the run's signed DHT records (where schedules are read)
    :param coordinator: the run's coordinator (its schedules are always trusted)
    :param heartbeat: the run's heartbeat period in seconds
    :param newest_held: the newest epoch a peer sent a message under (a sign a newer epoch exists)
    """

    def __init__(self, records: SwarmRecords, coordinator: str, heartbeat: float, *,
                 newest_held: Callable[[], int] = lambda: 0) -> None:
        self.records, self.coordinator, self.heartbeat = records, coordinator, heartbeat
        self.scheduler = coordinator
        """The peer whose schedules and notices this peer follows (the coordinator, or its successor)."""
        self.candidate: str | None = None
        """The scheduler's would-be successor while the scheduler misses heartbeats."""
        self.scheduler_seen = time.monotonic()
        self.known = Known()
        """The epoch in use; epochs between it and `newer` (`bridges`, oldest first, each in force from its start
        until the next one starts); a newer epoch read from the DHT, not started yet (`newer`). Written by the
        pipeline's thread only."""
        self.notice = threading.Event()
        """Set by a schedule notice: read the DHT again."""
        self.finished = threading.Event()
        """The scheduler said the run is over."""
        self.finished_after = 0
        """Iterations the run committed, as the scheduler's 'finished' says (0 until it does)."""
        self.gone: frozenset[str] = frozenset()
        """Peers the scheduler declared gone (replaced, never mutated)."""
        self._gone_under: dict[str, int] = {}
        """Peer -> the newest epoch when the scheduler declared it gone (`gone` is its keys)."""
        self._gone_lock = threading.Lock()
        """`gone` is written by the gossip thread (a 'gone') and the pipeline's (an epoch taken)."""
        self.committed_positions: tuple[int, dict[str, Any]] = (-1, {})
        """(iteration, shard index -> position) of the newest commit: where a shard taken over next starts."""
        self._commits: set[tuple[int, int]] = set()
        self._left_out: dict[int, frozenset[str]] = {}
        self._announced_epoch = 0
        self._beats: dict[str, int] = {}
        """Sender -> the highest sequence number of its beats (`Alive`) seen: the coordinator's, schedulers'."""
        self._newest_held = newest_held
        self._awaiting: tuple[int, int] | None = None
        """(epoch in use, iteration) when this peer found that iteration unable to finish: a replacement is due."""
        self._last_poll = 0.0
        self._read: ScheduleRead | None = None
        """The read of the newest schedule under way, or done and not taken yet."""
        self.carried = CarriedEpochs()
        """The epochs the notices carried (from the gossip thread), not taken yet."""
        self.sitting_out_until = 0.0
        """Until when (monotonic seconds) the scheduler said it leaves this peer out of the plan (`sit_out`)."""

    # ---- the scheduler --------------------------------------------------------------------------------------------
    def trusted(self, sender: str) -> bool:
        """The scheduler, or (once the scheduler has missed a heartbeat) its would-be successor."""
        if sender == self.scheduler:
            return True
        stale = time.monotonic() - self.scheduler_seen > self.heartbeat * 1.5
        return stale and sender == self.candidate

    def scheduler_silent(self) -> bool:
        """Neither the scheduler's record nor a message of its has been seen for longer than a record lives (three
        heartbeats and a grace)."""
        return time.monotonic() - self.scheduler_seen > silent_after(self.heartbeat)

    def no_scheduler(self, me: str) -> bool:
        """The scheduler is silent and no other live peer is about to succeed it (`candidate`, set by the watch):
        nobody will commit an iteration or plan a leave soon. A draining peer is never a candidate."""
        return self.scheduler_silent() and self.candidate in (None, me)

    def on_message(self, sender: str, message: ControlMessage, seqno: int = 0) -> bool:
        """Take a notice, a beat, 'gone', 'finished' or a commit from `sender` (`seqno`: the number its sidecar
        gave it, see `Alive`); True if the main loop should look again. Messages from anyone but the scheduler are
        logged and ignored."""
        if not isinstance(message, (ScheduleNotice, Alive, Gone, Finished, Commit)):
            return False
        news = self._news(sender, message, seqno)
        if sender == self.coordinator != self.scheduler and news:
            # this peer took the coordinator for dead (its record went unread past its lifetime: DHT stores time out
            # on a loaded host) while it lives on and the others follow it; ignoring its commits would leave this
            # peer out of every iteration. Only news counts: a replay cannot bring a dead coordinator back
            logger.warning("the coordinator %s is alive (%s): following it again instead of %s", sender,
                           type(message).__name__, self.scheduler,
                           extra=event("scheduler_changed", previous=self.scheduler, scheduler=sender))
            self.scheduler = sender
        if sender == self.scheduler and news:
            # its signed gossip shows it alive even while its DHT record is not (stores time out on a loaded host):
            # no successor takes over from a scheduler that still commits. Only news counts: a replay of its old
            # messages (signed, re-published by anyone) must not keep a dead scheduler in office
            self.scheduler_seen = time.monotonic()
        if isinstance(message, Alive):
            return False  # a beat says nothing more (one of a scheduler this peer does not follow passes quietly)
        if not self.trusted(sender):
            logger.warning("ignored a %s from %s: not the run's scheduler", type(message).__name__, sender,
                           extra=event("ignored_control", sender=sender, kind=type(message).__name__,
                                       why="not the run's scheduler"))
            return False
        if isinstance(message, ScheduleNotice):
            self._announced_epoch = max(self._announced_epoch, message.epoch)
            self.carried.offer(sender, message)
            self.notice.set()
            return False
        stale = self._stale(message)
        if stale:
            logger.warning("ignored a %s from %s: %s", type(message).__name__, sender, stale,
                           extra=event("ignored_control", sender=sender, kind=type(message).__name__, why=stale))
            return False
        if isinstance(message, Gone):
            with self._gone_lock:
                for p in message.peers:
                    self._gone_under[p] = max(message.epoch, self._gone_under.get(p, 0))
                self.gone = frozenset(self._gone_under)
        elif isinstance(message, Finished):
            logger.info("the run has finished")
            self.finished_after = message.iterations
            self.finished.set()
            self.notice.set()
        elif isinstance(message, Commit):
            if message.iteration > self.committed_positions[0]:
                self.committed_positions = (message.iteration, message.shards)
            self._commits.add((message.iteration, message.epoch))
            self._left_out[message.iteration] = frozenset(message.left_out)
        return True

    def placed_anew(self, schedule: Schedule) -> None:
        """`schedule` is taken: the peers it places that were declared gone under an older epoch are back (a holder
        restarted with its key, a peer taken back); one declared gone under this epoch or a newer one stays gone: it
        died after this epoch was planned, and detours and waits for its state must still go around it."""
        with self._gone_lock:
            for p in schedule.placement:
                if self._gone_under.get(p, schedule.epoch) < schedule.epoch:
                    del self._gone_under[p]
            self.gone = frozenset(self._gone_under)

    def _news(self, sender: str, message: ControlMessage, seqno: int) -> bool:
        """A commit of an iteration beyond the newest committed, the notice of a newer epoch, or a beat numbered
        above every one seen from `sender` of a scheduler not behind this peer (its iteration in progress is past
        the newest commit this peer took: a coordinator that was frozen while its successor committed is no
        scheduler to follow again). A beat's number is recorded here, so call it once per message."""
        if isinstance(message, Commit):
            return message.iteration > self.committed_positions[0]
        if isinstance(message, Alive):
            followed = (self.coordinator, self.scheduler, self.candidate)  # only theirs are kept: a bounded table
            if sender not in followed or seqno <= self._beats.get(sender, -1):
                return False
            self._beats[sender] = seqno
            if len(self._beats) > MAX_BEATING:
                self._beats.pop(next(p for p in self._beats if p != self.coordinator))
            return message.iteration > self.committed_positions[0]
        return isinstance(message, ScheduleNotice) and message.epoch > self._announced_epoch

    def _stale(self, message: ControlMessage) -> str | None:
        """Why a 'gone' or 'finished' belongs to the past (a replay), or None."""
        epoch = self.schedule.epoch if self.schedule is not None else 0
        if isinstance(message, (Gone, Finished)) and message.epoch < epoch:
            return f"it belongs to epoch {message.epoch}, this peer runs epoch {epoch}"
        if isinstance(message, Finished) and message.iterations <= self.committed_positions[0]:
            return f"it ends the run after {message.iterations} iterations, {self.committed_positions[0] + 1} are " \
                   "committed"
        return None

    # ---- commits --------------------------------------------------------------------------------------------------
    def is_committed(self, iteration: int, epoch: int) -> bool:
        return (iteration, epoch) in self._commits

    def left_out(self, iteration: int) -> frozenset[str]:
        """The peers whose averaging input no member takes for committed `iteration` (see `Commit.left_out`)."""
        return self._left_out.get(iteration, frozenset())

    def forget_commits_before(self, iteration: int) -> None:
        self._awaiting = None  # an iteration committed: whatever this peer awaited is settled
        self._commits = {c for c in self._commits if c[0] >= iteration}
        self._left_out = {i: peers for i, peers in self._left_out.items() if i >= iteration}

    # ---- epochs ---------------------------------------------------------------------------------------------------
    @property
    def schedule(self) -> Schedule | None:
        """The epoch in use."""
        return self.known.in_use

    @schedule.setter
    def schedule(self, schedule: Schedule | None) -> None:
        """Use `schedule` from now on: it, and any epoch pending before it, are pending no more."""
        known = self.known if schedule is None else self.known.past(schedule.epoch)
        self.known = known._replace(in_use=schedule)

    @property
    def newer(self) -> Schedule | None:
        return self.known.newer

    def _fetch_with_bridge(self) -> Found | None:
        """The newest schedule in the DHT signed by the coordinator or the current scheduler, and the epoch it
        bridges to (or None)."""
        msg = self.records.fetch_schedule(signers={self.coordinator, self.scheduler})
        return (msg.to_schedule(), msg.to_bridge()) if msg is not None else None

    @property
    def pending(self) -> tuple[Schedule, ...]:
        """The epochs read and not started yet, oldest first (`bridges`, `newer`)."""
        k = self.known
        return k.bridges + ((k.newer,) if k.newer is not None else ())

    def drop_pending(self, through: int | None = None) -> None:
        """Forget the epochs read and not started, up to epoch `through` (all if None): the caller took that one, or
        the newest places this peer no more."""
        self.known = Known(self.known.in_use) if through is None else self.known.past(through)

    def poll_newer(self, *, wait: float = 0.0) -> Schedule | None:
        """The newest schedule known if it is newer than the one in use. Starts a read of the DHT when one is due
        (see the module docstring) and none is under way, and takes what a finished read found, waiting up to `wait`
        seconds for the one under way; never waits on the DHT otherwise."""
        self._take_read(0.0)
        now = time.monotonic()
        since = now - self._last_poll
        lagging = self._announced_newer() or self._awaiting_replacement()
        if self._read is None and (self.notice.is_set() or since > SCHEDULE_POLL_PERIOD or
                                   (lagging and since > LAGGING_POLL_PERIOD)):
            self.notice.clear()
            self._last_poll = now
            self._read = ScheduleRead(self._fetch_with_bridge)
        self._take_read(wait)
        return self.newer

    def _announced_newer(self) -> bool:
        """A newer epoch than any this peer holds was announced, or a peer sent a message under one."""
        known = max(self.schedule.epoch, self.newer.epoch if self.newer is not None else -1)
        return max(self._announced_epoch, self._newest_held()) > known

    def await_replacement(self, iteration: int) -> None:
        """This peer told the scheduler `iteration` cannot finish under the epoch in use: read the DHT as often as
        for an announced epoch until one replacing it is read (the notice may be lost, or this peer may be the one
        behind: the others refusing its messages under an epoch they have left)."""
        self._awaiting = (self.schedule.epoch, iteration) if self.schedule is not None else None

    def _awaiting_replacement(self) -> bool:
        if self._awaiting is None:
            return False
        epoch, iteration = self._awaiting
        return self.schedule.epoch == epoch and not any(_start(s) <= iteration for s in self.pending)

    def _take_read(self, wait: float) -> None:
        """Keep the epoch a notice carried, and what the read under way found once it is done; while that read is
        under way and a newer epoch than these is known to exist, wait for the read or a notice, up to `wait` seconds
        (no longer than the read: a forged epoch ahead must not hold every iteration's start)."""
        end = time.monotonic() + wait
        while True:
            for found in self.carried.take():
                self._keep(found)
            read = self._read
            if read is not None and read.done.is_set():
                self._read = None
                if read.result is not None:
                    self._keep(read.result)
            left = end - time.monotonic()
            if left <= 0 or self._read is None or not self._announced_newer():
                return
            self._read.done.wait(min(left, DELIVERY_LOOK))

    def _keep(self, found: Found) -> None:
        """Keep `found` (a schedule and its bridge) as the newer epoch if it is newer than every one known."""
        schedule, bridge = found
        k = self.known
        newer = schedule if schedule.epoch > k.in_use.epoch and \
            (k.newer is None or schedule.epoch > k.newer.epoch) else k.newer
        # the newer epoch this one replaces may be a bridge of it (the record overwritten before this peer read the
        # one between): it stays a candidate
        candidates = k.bridges + tuple(s for s in (k.newer, bridge) if s is not None)
        self.known = Known(k.in_use, _bridges(candidates, k.in_use, newer), newer)

    def replaced(self, iteration: int) -> bool:
        """A newer epoch starts at (or before) `iteration`, which is to be abandoned."""
        self.poll_newer()
        return any(_start(s) <= iteration for s in self.pending)

    def due(self, iteration: int) -> Schedule | None:
        """The newest epoch read that starts at or before `iteration`, else None. It stays pending until the caller
        uses it (sets `schedule`) or drops it (`drop_pending`): until then the inbound checks must know it."""
        self.poll_newer(wait=ANNOUNCED_READ_WAIT if self._announced_newer() else 0.0)
        started = [s for s in self.pending if _start(s) <= iteration]
        return started[-1] if started else None

    def positions_for(self, schedule: Schedule, iteration: int, stop: threading.Event, timeout: float = COMMIT_WAIT
                      ) -> tuple[int, dict[str, Any]]:
        """The newest commit's (iteration, shard positions) for a holder that `schedule` places from `iteration`.
        Where the schedule's own positions are older than the commit of the iteration before (it was planned while
        that iteration ran, and a shard this peer takes over was drawn from meanwhile), that commit is waited for,
        up to `timeout` seconds: a joiner taking over a carried shard starts it where the commit leaves it. Returns
        what it has if the run finishes, `stop` is set or the wait runs out (the schedule's positions are used)."""
        try:
            after = int(schedule.meta.get("positions_after", iteration - 1))
        except (TypeError, ValueError):
            after = iteration - 1  # a malformed field: nothing to wait for, the schedule's positions stand
        end = time.monotonic() + timeout
        while after < iteration - 1 and self.committed_positions[0] < iteration - 1 and not stop.is_set() and \
                not self.finished.is_set() and time.monotonic() < end:
            time.sleep(0.1)
        if after < iteration - 1 and self.committed_positions[0] < iteration - 1:
            logger.warning("no commit of iteration %d came within %.0f s: the shards this peer takes over start "
                           "where epoch %d says", iteration - 1, timeout, schedule.epoch)
        return self.committed_positions

    def wait_for_replacement(self, iteration: int, stop: threading.Event, timeout: float) -> bool:
        """Wait up to `timeout` seconds for an epoch that replaces `iteration`; False at once if the run finishes."""
        end = time.monotonic() + timeout
        self.await_replacement(iteration)
        while not stop.is_set() and not self.finished.is_set() and time.monotonic() < end:
            if self.replaced(iteration):
                return True
            time.sleep(0.2)
        return False

    def sit_out(self, seconds: float) -> None:
        """The scheduler leaves this peer out of the plan for `seconds` (an estrangement, a bench; from the gossip
        thread): a wait for placement under way or to come lasts that much longer."""
        self.sitting_out_until = max(self.sitting_out_until, time.monotonic() + seconds)

    def wait_for_placement(self, peer: str, stop: threading.Event, timeout: float, *,
                           newer_than: int = -1) -> Schedule | None:
        """The first schedule placing `peer` (of an epoch after `newer_than`), waiting up to `timeout` seconds (after
        a sit-out the scheduler announced, if later); None if the run finished or `stop` was set first. Where the
        newest comes with a bridge that places `peer` too, that one (the others run the iteration in progress under
        it), the newest left pending as `newer`. The newest is the last epoch a notice carried, else the DHT's."""
        end = time.monotonic() + timeout
        follow_up_until = 0.0
        while not stop.is_set() and not self.finished.is_set() and \
                time.monotonic() < max(end, self.sitting_out_until + timeout):
            delivered = self.carried.take()
            found = delivered[-1] if delivered else self._fetch_with_bridge()
            schedule, bridge = found if found is not None else (None, None)
            if schedule is not None and peer in schedule.placement and schedule.epoch > newer_than:
                if bridge is not None and peer in bridge.placement and bridge.epoch > newer_than:
                    # placed by an epoch that runs the iteration in progress: start there
                    self.known = self.known._replace(newer=schedule)
                    return bridge
                return schedule
            if self.notice.wait(LAGGING_POLL_PERIOD if time.monotonic() < follow_up_until else
                                PLACEMENT_POLL_PERIOD):
                follow_up_until = time.monotonic() + NOTICE_FOLLOW_UP
            self.notice.clear()
        return None


def _start(schedule: Schedule) -> int:
    return int(schedule.meta.get("start_iteration", 0))


def _bridges(candidates: tuple[Schedule, ...], in_use: Schedule, newer: Schedule | None) -> tuple[Schedule, ...]:
    """The bridges still to run, oldest first: each after the epoch in use and before `newer`, each starting later
    than the one before it and earlier than `newer` (a rerun that starts at or before a bridge's start replaced it)."""
    if newer is None:
        return ()
    by_epoch = {b.epoch: b for b in candidates if in_use.epoch < b.epoch < newer.epoch and _start(b) < _start(newer)}
    kept: list[Schedule] = []
    for b in sorted(by_epoch.values(), key=lambda b: b.epoch):
        while kept and _start(kept[-1]) >= _start(b):
            kept.pop()  # a later epoch from the same iteration or before: that one replaced it
        kept.append(b)
    return tuple(kept)
