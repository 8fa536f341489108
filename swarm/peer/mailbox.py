"""`Inbox` and `Outbox`: the peer's messages between the transport and its main loop, bounded both ways.

The transport hands each accepted message to `Inbox.put` from the consumer thread of the channel it came on
(pipeline hops, averaging, stage state: `swarm.net.transport.CHANNELS`); the main loop (the only user of the worker)
takes them with `receive`, by kind and iteration. Both ends are bounded: a full inbox of a kind makes that channel's
consumer wait, and then its senders, so a slow stage slows the stages sending to it instead of growing a queue, and
a flood of one kind never holds up another. `Outbox.send` hands a message to its kind's few sender threads and waits
while too many are pending.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Literal

import torch

from swarm.constants import (
    AVERAGE_OUTBOX_SIZE,
    CHUNK_BYTES,
    INBOX_SIZE,
    MAX_BUFFERED_MESSAGES,
    MAX_TENSOR_BYTES,
    OUTBOX_SIZE,
    SEND_CONCURRENCY,
)
from swarm.net.delivery import Inbound, Undelivered
from swarm.net.transport import MessageRefused, PeerUnreachable, Transport, TransportError
from swarm.peer.attempts import Requeue
from swarm.peer.faults import Tamper
from swarm.peer.message_chunks import Reassembly, cut
from swarm.peer.message_padding import MessagePadding
from swarm.peer.timeline import Timeline
from swarm.wire import Direction, HopHeader

logger = logging.getLogger(__name__)

Kind = Literal["hop", "average", "state"]
"""The transport's channels (`swarm.net.transport.Channel`)."""
KINDS: tuple[Kind, ...] = ("hop", "average", "state")
MAX_SIGNALS = 4096
"""The peer's own signals (undelivered sends, re-queue reports) waiting for its main loop."""
MAX_HELD = 256
"""Messages of newer epochs than the one in use, kept until the peer adopts one."""
MAX_EPOCHS_AHEAD = 8
"""Messages of an epoch further ahead of the one in use are dropped: epochs come one at a time (a peer that adopted
the next few first is plausible, a forged far-future epoch is not)."""
MAX_ITERATIONS_AHEAD = 2
"""Messages for iterations further ahead than this are refused, so a flood cannot fill memory."""
PIPELINE = (Direction.FORWARD, Direction.BACKWARD)
KIND_OF: dict[Direction, Kind] = {Direction.FORWARD: "hop", Direction.BACKWARD: "hop", Direction.AVERAGE: "average",
                                  Direction.STATE: "state"}


def epoch_of(m: Inbound | Undelivered | Requeue) -> int:
    """The epoch a filed item belongs to: a message's header says it, a re-queue report carries it."""
    return m.epoch if isinstance(m, Requeue) else m.header.epoch


class Inbox:
    """Messages for the main loop, by kind (pipeline hops, averaging, stage state) and iteration.

    The owner keeps `iteration` and `epoch` current. Messages of older iterations are dropped (except those of an
    epoch that reruns an earlier iteration, which a fresh joiner may run too), of iterations too far ahead refused,
    and of a newer epoch than the one in use held until the owner adopts it (`adopt`); before it adopted any (a
    joiner waiting for its placement), every message but stage state is held. Stage state is kept until
    used, or an iteration old once the peer is online. Every `receive` sorts whatever arrived, of every kind.

    Only the transport's consumers ever wait (`put`, one bound per kind); the peer's own signals (`signal`: an
    undelivered send, a re-queue report, a wake-up) never wait, so a gossip or sender thread is never held up.
    """

    def __init__(self, size: int = INBOX_SIZE) -> None:
        self.size = size
        self._cond = threading.Condition()
        self._raw: dict[Kind, deque] = {kind: deque() for kind in KINDS}
        self._signals: deque = deque()
        self._buckets: dict[tuple[int, Kind], list] = defaultdict(list)
        self._held: list[Inbound] = []
        self._closed = False
        self._woken = False
        self.iteration = 0
        self.epoch = -1
        self.online = False
        """Whether the owner serves its stage (a state transfer it did not use is void an iteration later)."""
        self.newest_epoch = 0
        """The newest epoch a held message was sent under."""
        self.assembly = Reassembly(MAX_TENSOR_BYTES)
        """Pieces of chunked stage-group messages; the owner sizes it to its run's model (`largest_stage_message`)."""

    def consumer(self, kind: Kind) -> Callable[[str, HopHeader, torch.Tensor], None]:
        """The transport's consumer of channel `kind`: its messages into this inbox (see `put`)."""
        return lambda sender, header, tensor: self.put(Inbound(sender, header, tensor), kind)

    def put(self, item: Inbound, kind: Kind = "hop") -> None:
        """A transport consumer's thread: hand the main loop a message of `kind`; waits while that kind has `size`
        messages the main loop has not sorted yet (its senders then wait too). Dropped once the inbox is closed."""
        with self._cond:
            while len(self._raw[kind]) >= self.size and not self._closed:
                self._cond.wait()
            if not self._closed:
                self._raw[kind].append(item)
                self._cond.notify_all()

    def signal(self, item: Undelivered | Requeue | None) -> None:
        """Any thread: hand the main loop an undelivered send or a re-queue report (None only wakes it); never
        waits (past MAX_SIGNALS unsorted ones, the newest is dropped with a warning)."""
        with self._cond:
            if item is None:
                self._woken = True
            elif len(self._signals) >= MAX_SIGNALS:
                logger.warning("dropped %s: %d signals wait for the main loop", type(item).__name__, MAX_SIGNALS)
            else:
                self._signals.append(item)
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake the main loop (a notice changed what it waits for): a `receive` waiting for pipeline messages
        returns at once, with whatever it has; never waits."""
        self.signal(None)

    def close(self) -> None:
        """The peer leaves: release every waiting transport consumer; later messages are dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def receive(self, kind: Kind, timeout: float, *, any_iteration: bool = False) -> list:
        """The messages of `kind` for the current iteration (any iteration with `any_iteration`), waiting up to
        `timeout` seconds for a first one."""
        keys = lambda: [k for k in self._buckets if k[1] == kind and (any_iteration or k[0] == self.iteration)]  # noqa: E731
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                self._sort()
                woken, self._woken = self._woken and kind == "hop", self._woken and kind != "hop"
                if woken or any(self._buckets[k] for k in keys()) or (left := end - time.monotonic()) <= 0:
                    break
                self._cond.wait(left)
            for old in [k for k in self._buckets if k[0] < self.iteration - (1 if k[1] == "state" else 0) and
                        (k[1] != "state" or self.online)]:
                del self._buckets[old]
            out: list = []
            for k in keys():
                out.extend(self._buckets.pop(k, []))
            return out

    def hold(self, m: Inbound) -> None:
        """Keep a message of a newer epoch than the one in use (its sender switched first) until the owner does;
        past MAX_HELD such messages, the newest is dropped, and so is one more than MAX_EPOCHS_AHEAD epochs ahead (a
        forged far-future epoch cannot pile them up, nor make this peer poll for an epoch that will not come)."""
        with self._cond:
            if self.epoch >= 0 and m.header.epoch > self.epoch + MAX_EPOCHS_AHEAD:
                logger.warning("dropped a message of epoch %d from %s: this peer runs epoch %d", m.header.epoch,
                               m.sender, self.epoch)
                return
            if len(self._held) >= MAX_HELD:
                logger.warning("dropped a message of epoch %d from %s: %d messages of newer epochs are held already",
                               m.header.epoch, m.sender, MAX_HELD)
                return
            self._held.append(m)
            self.newest_epoch = max(self.newest_epoch, m.header.epoch)

    def adopt(self, epoch: int) -> None:
        """The owner runs `epoch` now: messages of older epochs are void, held ones of this epoch are filed."""
        with self._cond:
            self.epoch = epoch
            self._buckets = defaultdict(list, {k: kept for k, v in self._buckets.items()
                                               if (kept := [m for m in v if k[1] == "state" or
                                                            epoch_of(m) >= epoch])})
            held, self._held = self._held, []
            for m in held:
                if m.header.epoch > epoch:
                    self._held.append(m)
                elif m.header.epoch == epoch:
                    self._file(m)

    def drop_state(self) -> None:
        """Forget stage state sent to this peer (it has its stage now), also what is not sorted yet."""
        with self._cond:
            self._sort()
            for k in [k for k in self._buckets if k[1] == "state"]:
                del self._buckets[k]

    def _sort(self) -> None:
        """File the signals, then what the transport delivered, while the sorted messages stay under the bound
        (past it the transport's consumers wait until the main loop catches up)."""
        while self._signals:
            self._file(self._signals.popleft())
        for raw in self._raw.values():
            while raw and sum(map(len, self._buckets.values())) < MAX_BUFFERED_MESSAGES:
                self._file(raw.popleft())
        self._cond.notify_all()

    def _file(self, m: Inbound | Undelivered | Requeue | None) -> None:
        if m is None:
            return
        if isinstance(m, (Requeue, Undelivered)):
            it = m.iteration if isinstance(m, Requeue) else m.header.iteration
            if it == self.iteration:
                self._buckets[(it, "hop")].append(m)
            return
        if m.header.chunks > 1:
            m = self.assembly.add(m)  # the whole message once its last piece is in
            if m is None:
                return
        it = m.header.iteration
        kind = KIND_OF[m.header.direction]
        if kind == "state":
            # kept even while this peer serves the stage it is for: its sender may have adopted an epoch that moves
            # this peer first; unused, it is dropped an iteration later (`receive`)
            self._buckets[(it, kind)].append(m)
        elif self.epoch < 0:
            self.hold(m)  # not placed yet: kept for the epoch that places this joiner (its senders heard of it first)
        elif it < self.iteration and m.header.epoch > self.epoch >= 0:
            self.hold(m)  # an epoch that reruns an earlier iteration: this fresh joiner may run it too
        elif it < self.iteration:
            logger.debug("stale message of iteration %d from %s dropped", it, m.sender)
        elif it > self.iteration + MAX_ITERATIONS_AHEAD:
            logger.warning("dropped a message of iteration %d from %s: this peer is at iteration %d", it, m.sender,
                           self.iteration)
        else:
            self._buckets[(it, kind)].append(m)


class Outbox:
    """Sends on sender threads of each kind's own (pipeline hops, averaging, stage state, and checks of a late
    next hop with the hops), so a slow receiver of one kind never holds up the others; a pipeline message that
    could not be delivered comes back to the inbox as `Undelivered` (its executor detours it or reports it broken).
    Stage state goes to each receiver in order, one part at a time (a receiver reads one message per sender and
    channel at a time), and to several receivers at once: a joiner that reads slowly holds up only its own state.

    :param transport: returns the transport (None once it is shut down)
    :param wire_dtype: the run's compression of pipeline tensors (float32 = none)
    :param failed: called with (peer, unreachable) when a send fails, before the message comes back
    :param tamper: changes every message before it is sent (`swarm.peer.faults`: a peer misbehaving on purpose)
    :param sent: called with (peer, seconds, bytes) of each pipeline message delivered (`LinkWatch.sent`)
    :param chunk_bytes: stage-group messages larger than this go as pieces (`swarm.peer.message_chunks`)
    """

    THREADS: dict[Kind, int] = {"hop": SEND_CONCURRENCY, "average": 2, "state": SEND_CONCURRENCY}

    def __init__(self, transport: Callable[[], Transport | None], inbox: Inbox, timeline: Timeline, *,
                 wire_dtype: str = "float32", failed: Callable[[str, bool], None] | None = None,
                 tamper: Tamper | None = None, chunk_bytes: int = CHUNK_BYTES,
                 sent: Callable[[str, float, int], None] | None = None) -> None:
        self._transport, self._inbox, self._timeline, self._tamper = transport, inbox, timeline, tamper
        self._sent = sent
        self.chunk_bytes = chunk_bytes
        self.wire_dtype = wire_dtype
        self.padding: MessagePadding | None = None
        """Pads pipeline tensors to the run's emulated message size (`swarm.message_bytes`), None = sent as is."""
        self._failed = failed
        self._pools = {kind: ThreadPoolExecutor(n, thread_name_prefix=f"skippipe-send-{kind}")
                       for kind, n in self.THREADS.items()}
        self._room = {kind: threading.BoundedSemaphore(AVERAGE_OUTBOX_SIZE if kind == "average" else OUTBOX_SIZE)
                      for kind in self.THREADS}
        self._lanes: dict[tuple[Kind, str], deque[tuple[Callable[[], bool], Future[bool]]]] = {}
        self._lanes_lock = threading.Lock()

    def send(self, peer: str, header: HopHeader, tensor: torch.Tensor, *, report: bool = True) -> Future[bool]:
        """Queue a message for `peer`; the future says whether it was delivered (a stage-group message too large for
        one goes as several pieces: `swarm.peer.message_chunks`; delivered once all of them are). With `report`
        False a failure is not told to `failed`: a courtesy copy to a peer that may rightly refuse it."""
        plain = header.direction in (Direction.AVERAGE, Direction.STATE) or self.wire_dtype == "float32"
        wire = None if plain else self.wire_dtype
        if header.direction in PIPELINE:
            header = replace(header, sent_at=time.time())  # before the queue: its wait is the link's too
        if self._tamper is not None:
            tampered = self._tamper(header, tensor)
            if tampered is None:  # withheld on purpose: as far as this peer says, it went
                withheld: Future[bool] = Future()
                withheld.set_result(True)
                return withheld
            header, tensor = tampered
        kind = KIND_OF[header.direction]
        sent = [self.submit(functools.partial(self._deliver, peer, h, t, wire, report), kind,
                            lane=peer if kind == "state" else None) for h, t in cut(header, tensor, self.chunk_bytes)]
        return sent[0] if len(sent) == 1 else all_delivered(sent)

    def _deliver(self, peer: str, header: HopHeader, tensor: torch.Tensor, wire: str | None, report: bool = True
                 ) -> bool:
        """Send one message on this sender thread; whether it was delivered (a pipeline message that was not comes
        back to the inbox as `Undelivered`)."""
        try:
            transport = self._transport()
            if transport is None:
                raise TransportError("the transport is shut down")
            start = time.time()
            padded = self.padding.pad(tensor) if self.padding and header.direction in PIPELINE else tensor
            transport.send(peer, header, padded, wire_dtype=wire)
            end, nbytes = time.time(), padded.numel() * padded.element_size()
            self._timeline.record(f"send_{header.direction.name.lower()}", start, end, to=peer,
                                  microbatch=header.microbatch, iteration=header.iteration, bytes=nbytes)
            if self._sent is not None and header.direction in PIPELINE:  # the bytes on the wire: 2 each if cast
                self._sent(peer, end - start, padded.numel() * 2 if wire else nbytes)
            return True
        except (TransportError, ValueError) as e:
            logger.warning("could not send %s of microbatch %d to %s: %s", header.direction.name.lower(),
                           header.microbatch, peer, e)
            unreachable = isinstance(e, PeerUnreachable)
            if self._failed is not None and report and not isinstance(e, MessageRefused):  # it answered: reachable
                self._failed(peer, unreachable)
            if header.direction in PIPELINE:
                self._inbox.signal(Undelivered(peer, header, tensor, unreachable=unreachable))
            return False

    def submit(self, job: Callable[[], bool], kind: Kind = "hop", *, lane: str | None = None) -> Future[bool]:
        """Run `job` on a sender thread of `kind` (waits while OUTBOX_SIZE jobs of that kind are pending). Jobs of
        one `lane` (a receiver) run one at a time, in the order submitted."""
        room = self._room[kind]
        room.acquire()

        def run() -> bool:
            try:
                return job()
            finally:
                room.release()

        try:
            if lane is None:
                return self._pools[kind].submit(run)
            future: Future[bool] = Future()
            with self._lanes_lock:  # a drain starting now waits for this job to be queued
                queued = self._lanes.get((kind, lane))
                if queued is None:
                    self._pools[kind].submit(self._drain, kind, lane)
                    queued = self._lanes[(kind, lane)] = deque()
                queued.append((run, future))
            return future
        except RuntimeError:  # shut down
            room.release()
            raise

    def _drain(self, kind: Kind, lane: str) -> None:
        """Run the jobs of one lane in order until it is empty (then it is removed: the next job starts a drain)."""
        while True:
            with self._lanes_lock:
                queued = self._lanes[(kind, lane)]
                if not queued:
                    del self._lanes[(kind, lane)]
                    return
                run, future = queued.popleft()
            if not future.set_running_or_notify_cancel():
                self._room[kind].release()
                continue
            try:
                future.set_result(run())
            except BaseException as e:  # the job's failure is its future's
                future.set_exception(e)

    def shutdown(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lanes_lock:  # lanes whose drain was cancelled before it ran: their jobs will not run
            for queued in self._lanes.values():
                for _, future in queued:
                    future.cancel()
            self._lanes.clear()


def all_delivered(futures: list[Future[bool]]) -> Future[bool]:
    """A future that is True once every one of `futures` is, False as soon as one is not (or fails)."""
    out: Future[bool] = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def done(f: Future[bool]) -> None:
        ok = not f.cancelled() and f.exception() is None and bool(f.result())
        with lock:
            if out.done():
                return
            left[0] -= 1
            if not ok:
                out.set_result(False)
            elif not left[0]:
                out.set_result(True)

    for f in futures:
        f.add_done_callback(done)
    return out
