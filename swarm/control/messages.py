"""The control messages peers and the scheduler gossip, as frozen dataclasses with explicit msgpack fields.

Each message is one msgpack map: ``{"type": NAME, "version": WIRE_VERSION, ...its fields}``, published on the
topic its class names (membership, schedule or progress of the run). :func:`decode` trusts nothing, as
`swarm.wire`'s decoders do: strict types, ranges and sizes, one :class:`~swarm.wire.WireError` naming the field;
fields it does not know are ignored. Who may send which message (the scheduler, a scheduled peer, a data holder)
is for the receiver to check against its schedule: a message says what it claims, not that it is true.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from scheduler.constants import MAX_PEERS, MAX_STAGES
from swarm.constants import (
    MAX_ADDRESS_CHARS,
    MAX_ADDRESSES,
    MAX_CERT_BYTES,
    MAX_ERROR_CHARS,
    MAX_GOSSIPED_SCHEDULE_BYTES,
    MAX_ID_CHARS,
    MAX_MICROBATCH_ATTEMPTS,
    MAX_PROOF_BYTES,
    MAX_SHARDS,
    WIRE_VERSION,
)
from swarm.control.gossip import GossipClient, GossipMessage, membership_topic, progress_topic, schedule_topic
from swarm.wire import (
    ScheduleMsg,
    WireError,
    read_bytes,
    read_float,
    read_int,
    read_list,
    read_map,
    read_str,
    read_version,
)

Topic = Literal["membership", "schedule", "progress"]
_MAX_ITERATION = 1 << 40
_MAX_MICROBATCH = 1 << 20
_POSITION_FIELDS = ("holder", "num_holders", "epoch", "cursor")
_SEEK_FIELDS = ("chunk", "doc", "file", "offset", "token")
"""Optional: where the chunk holding the cursor starts (`peers.data.RESUME_FIELDS`), so a holder taking a shard over
seeks there instead of re-reading the pass up to the cursor; all of them or none."""


_TOPICS = {"membership": membership_topic, "schedule": schedule_topic, "progress": progress_topic}


def _iteration(d: dict, name: str) -> int:
    return read_int(d.get("iteration"), f"{name}.iteration", 0, _MAX_ITERATION)


def _epoch(d: dict, name: str) -> int:
    return read_int(d.get("epoch"), f"{name}.epoch", 0, _MAX_ITERATION)


def _peer(d: dict, name: str, key: str = "peer") -> str:
    return read_str(d.get(key), f"{name}.{key}", MAX_ID_CHARS)


def _why(d: dict, name: str) -> str:
    return read_str(d.get("why", ""), f"{name}.why", MAX_ERROR_CHARS, allow_empty=True)


def _flag(d: dict, key: str, name: str) -> bool:
    value = d.get(key, False)
    if type(value) is not bool:
        raise WireError(f"{name}.{key}: expected true or false, got {type(value).__name__}")
    return value


def _loss(value: Any, name: str) -> float:
    """A loss sum: any float, NaN and infinities included (a diverged step is reported as it is; the workers skip
    non-finite steps, and the iteration must still commit)."""
    if type(value) not in (int, float):
        raise WireError(f"{name}: expected a number, got {type(value).__name__}")
    return float(value)


def read_positions(value: Any, name: str) -> dict[str, dict[str, int]]:
    """Shard positions: shard index as a decimal string -> {holder, num_holders, epoch, cursor}, all ints >= 0."""
    d = read_map(value, name)
    if len(d) > MAX_SHARDS:
        raise WireError(f"{name}: {len(d)} shards exceed the limit of {MAX_SHARDS}")
    out = {}
    for key, position in d.items():
        if type(key) is not str or not key.isdecimal() or int(key) >= MAX_SHARDS:
            raise WireError(f"{name}: shard index {key!r:.40} is not a number below {MAX_SHARDS}")
        p = read_map(position, f"{name}[{key}]")
        out[key] = {k: read_int(p.get(k), f"{name}[{key}].{k}", 0, _MAX_ITERATION) for k in _POSITION_FIELDS}
        if all(k in p for k in _SEEK_FIELDS):
            out[key].update({k: read_int(p.get(k), f"{name}[{key}].{k}", 0, 1 << 62) for k in _SEEK_FIELDS})
    return out


@dataclass(frozen=True)
class Join:
    """A peer announces itself on the control plane (its placement waits for its DHT record), with its proof of the
    join token (`admission`, b"" without one) and when it said so (`sent`, DHT clock; 0 = not said): a joiner the
    run does not admit hears why, although the DHT refuses its record (`swarm.control.record_writers`), and a Join
    replayed later is too old to be answered."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    admission: bytes = b""
    sent: float = 0.0

    @classmethod
    def _decode(cls, d: dict, name: str) -> Join:
        return cls(peer=_peer(d, name), admission=read_bytes(d.get("admission", b""), f"{name}.admission",
                                                             MAX_PROOF_BYTES),
                   sent=read_float(d.get("sent", 0.0), f"{name}.sent", 0.0))


@dataclass(frozen=True)
class Leave:
    """A peer leaves now (its heartbeat record says so too)."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str

    @classmethod
    def _decode(cls, d: dict, name: str) -> Leave:
        return cls(peer=_peer(d, name))


@dataclass(frozen=True)
class Gone:
    """The scheduler takes `peers` for gone while `iteration` runs under `epoch`: forwards are detoured around
    them. The epoch says what it belongs to: replayed once a later epoch runs (a peer came back), it is ignored."""

    TOPIC: ClassVar[Topic] = "membership"
    peers: tuple[str, ...]
    iteration: int
    epoch: int

    def _fields(self) -> dict[str, Any]:
        return {"peers": list(self.peers), "iteration": self.iteration, "epoch": self.epoch}

    @classmethod
    def _decode(cls, d: dict, name: str) -> Gone:
        peers = read_list(d.get("peers"), f"{name}.peers", MAX_PEERS)
        return cls(peers=tuple(read_str(p, f"{name}.peers[{i}]") for i, p in enumerate(peers)),
                   iteration=_iteration(d, name), epoch=_epoch(d, name))


@dataclass(frozen=True)
class Finished:
    """The run is over after `iterations` under `epoch` (its last one, or its operator `stopped` it): peers leave
    at once. Replayed later (iterations fewer than were committed since, an older epoch), it is ignored."""

    TOPIC: ClassVar[Topic] = "membership"
    iterations: int
    epoch: int
    stopped: bool = False

    @classmethod
    def _decode(cls, d: dict, name: str) -> Finished:
        return cls(iterations=read_int(d.get("iterations"), f"{name}.iterations", 0, _MAX_ITERATION),
                   epoch=_epoch(d, name), stopped=_flag(d, "stopped", name))


@dataclass(frozen=True)
class Stuck:
    """`peer`'s part of `iteration` under `epoch` passed its deadline: the scheduler reruns it if nobody died."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    iteration: int
    epoch: int

    @classmethod
    def _decode(cls, d: dict, name: str) -> Stuck:
        return cls(peer=_peer(d, name), iteration=_iteration(d, name), epoch=_epoch(d, name))


@dataclass(frozen=True)
class Broken:
    """`attempt` of `microbatch` cannot finish at reporter `peer`: `gone`, a peer on its path, held its
    activations. Its data holder re-queues it; the scheduler takes `gone` out if the reporter could not reach it.

    `maybe_ran`: `gone` may have run this attempt's backward (a send to it failed after it may have arrived)."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    iteration: int
    epoch: int
    microbatch: int
    attempt: int
    gone: str
    maybe_ran: bool = False
    why: str = ""

    @classmethod
    def _decode(cls, d: dict, name: str) -> Broken:
        return cls(peer=_peer(d, name), iteration=_iteration(d, name), epoch=_epoch(d, name),
                   microbatch=read_int(d.get("microbatch"), f"{name}.microbatch", 0, _MAX_MICROBATCH),
                   attempt=read_int(d.get("attempt"), f"{name}.attempt", 0, MAX_MICROBATCH_ATTEMPTS),
                   gone=_peer(d, name, "gone"), maybe_ran=_flag(d, "maybe_ran", name), why=_why(d, name))


@dataclass(frozen=True)
class Unrecoverable:
    """Data holder `peer` cannot re-queue `microbatch` (no detour, or too many attempts broke): the scheduler runs
    `iteration` again under a new epoch."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    iteration: int
    epoch: int
    microbatch: int
    why: str = ""

    @classmethod
    def _decode(cls, d: dict, name: str) -> Unrecoverable:
        return cls(peer=_peer(d, name), iteration=_iteration(d, name), epoch=_epoch(d, name),
                   microbatch=read_int(d.get("microbatch"), f"{name}.microbatch", 0, _MAX_MICROBATCH),
                   why=_why(d, name))


@dataclass(frozen=True)
class Unreachable:
    """The sender could open no stream to `peer` (the scheduler corroborates such reports before acting)."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str

    @classmethod
    def _decode(cls, d: dict, name: str) -> Unreachable:
        return cls(peer=_peer(d, name))


@dataclass(frozen=True)
class ScheduleNotice:
    """The scheduler published schedule `epoch`. `schedule` carries it: the msgpack of its `ScheduleMsg` (with its
    bridge), which the receiver parses as strictly as one read from the DHT, and takes only from its scheduler. Empty
    where the epoch is too large to gossip (MAX_GOSSIPED_SCHEDULE_BYTES): the peers read it from the DHT then, where
    the scheduler stores every epoch in any case (for joiners, and for peers that missed the notice)."""

    TOPIC: ClassVar[Topic] = "schedule"
    epoch: int
    schedule: bytes = b""

    @classmethod
    def _decode(cls, d: dict, name: str) -> ScheduleNotice:
        return cls(epoch=_epoch(d, name), schedule=read_bytes(d.get("schedule", b""), f"{name}.schedule",
                                                              MAX_GOSSIPED_SCHEDULE_BYTES))

    @classmethod
    def of(cls, msg: ScheduleMsg, limit: int = MAX_GOSSIPED_SCHEDULE_BYTES) -> ScheduleNotice:
        """The notice of `msg`'s epoch, carrying it where it fits in `limit` bytes (at most the default)."""
        data = msg.to_msgpack()
        fits = len(data) <= min(limit, MAX_GOSSIPED_SCHEDULE_BYTES)
        return cls(epoch=msg.epoch, schedule=data if fits else b"")

    def carried(self) -> ScheduleMsg | None:
        """The epoch this notice carries, parsed as strictly as one read from the DHT; None if it carries none.
        Raises WireError if it is malformed or not the epoch announced."""
        if not self.schedule:
            return None
        try:
            msg = ScheduleMsg.from_msgpack(self.schedule, max_bytes=MAX_GOSSIPED_SCHEDULE_BYTES)
        except WireError as e:
            raise WireError(f"schedule notice: the epoch carried: {e}") from None
        if msg.epoch != self.epoch:
            raise WireError(f"schedule notice: it announces epoch {self.epoch} and carries epoch {msg.epoch}")
        return msg


@dataclass(frozen=True)
class Alive:
    """The scheduler beats on gossip: it is alive, `iteration` is the one it has in progress (those before are
    committed) and `epoch` its newest. A watch that read only the scheduler's DHT record took a live scheduler for
    dead whenever its stores timed out on a loaded DHT. A receiver takes a beat as news only when its sequence
    number (the sender's sidecar numbers what it publishes, under its signature) is above every one seen from that
    sender: anyone may re-publish an old beat, nobody can make a new one."""

    TOPIC: ClassVar[Topic] = "schedule"
    epoch: int
    iteration: int

    @classmethod
    def _decode(cls, d: dict, name: str) -> Alive:
        return cls(epoch=_epoch(d, name), iteration=_iteration(d, name))


@dataclass(frozen=True)
class Done:
    """Data holder `peer` finished its microbatches of `iteration` under `epoch`: their summed loss, their count,
    the tokens they carried, when it started and finished (its wall clock) and where its shards now stand."""

    TOPIC: ClassVar[Topic] = "progress"
    peer: str
    iteration: int
    epoch: int
    loss_sum: float
    losses: int
    tokens: int
    started: float
    finished: float
    shards: dict[str, dict[str, int]] = field(default_factory=dict)
    dropped: int = 0
    """Messages it refused in the iteration (not matching the schedule, or refused by its worker)."""
    operations: int = 0
    """Forward and backward passes it computed in the iteration (0: not said, from a peer that predates it)."""
    compute: float = 0.0
    """Seconds those passes took, wall clock (a machine taken by another job shows here, not only in its lateness)."""

    @classmethod
    def _decode(cls, d: dict, name: str) -> Done:
        return cls(peer=_peer(d, name), iteration=_iteration(d, name), epoch=_epoch(d, name),
                   loss_sum=_loss(d.get("loss_sum"), f"{name}.loss_sum"),
                   losses=read_int(d.get("losses"), f"{name}.losses", 0, _MAX_ITERATION),
                   tokens=read_int(d.get("tokens"), f"{name}.tokens", 0, _MAX_ITERATION),
                   started=read_float(d.get("started"), f"{name}.started", 0.0),
                   finished=read_float(d.get("finished"), f"{name}.finished", 0.0),
                   shards=read_positions(d.get("shards", {}), f"{name}.shards"),
                   dropped=read_int(d.get("dropped", 0), f"{name}.dropped", 0, _MAX_ITERATION),
                   operations=read_int(d.get("operations", 0), f"{name}.operations", 0, _MAX_ITERATION),
                   compute=read_float(d.get("compute", 0.0), f"{name}.compute", 0.0, 1e7))


@dataclass(frozen=True)
class Pace:
    """Relay `peer` (a scheduled peer of a later stage, no data of its own) computed `operations` forward and backward
    passes of committed `iteration` under `epoch` in `compute` seconds, wall clock: how the scheduler finds a relay
    slow for good (`swarm.coordinator.slow_relays`), which no data holder's report shows as its own."""

    TOPIC: ClassVar[Topic] = "progress"
    peer: str
    iteration: int
    epoch: int
    operations: int
    compute: float

    @classmethod
    def _decode(cls, d: dict, name: str) -> Pace:
        return cls(peer=_peer(d, name), iteration=_iteration(d, name), epoch=_epoch(d, name),
                   operations=read_int(d.get("operations"), f"{name}.operations", 1, _MAX_ITERATION),
                   compute=read_float(d.get("compute"), f"{name}.compute", 0.0, 1e7))


@dataclass(frozen=True)
class Commit:
    """The scheduler commits `iteration` under `epoch` (peers average and step); `shards` are the run's shard
    positions after it, where a shard that changes holder next starts; `left_out` are the peers of the epoch whose
    averaging input no member takes (declared gone or evicted by then): one set for the whole group, so that no
    two members average over different contributions (they would no longer hold the same weights). A data holder
    among them was not counted either: the commit went on without its microbatches, and if it is alive it puts
    its draws back."""

    TOPIC: ClassVar[Topic] = "progress"
    iteration: int
    epoch: int
    shards: dict[str, dict[str, int]] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()

    def _fields(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "epoch": self.epoch, "shards": self.shards,
                "left_out": list(self.left_out)}

    @classmethod
    def _decode(cls, d: dict, name: str) -> Commit:
        left_out = read_list(d.get("left_out", []), f"{name}.left_out", MAX_PEERS)
        return cls(iteration=_iteration(d, name), epoch=_epoch(d, name),
                   shards=read_positions(d.get("shards", {}), f"{name}.shards"),
                   left_out=tuple(read_str(p, f"{name}.left_out[{i}]") for i, p in enumerate(left_out)))


@dataclass(frozen=True)
class Faulty:
    """`peer` refused `suspect`'s contribution to their stage group's averaging of `iteration` under `epoch` as
    proof of a fault (a gradient far outside the stage's history, a non-finite one): the scheduler evicts a
    suspect that two members of its group report, in two iterations."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    suspect: str
    iteration: int
    epoch: int
    why: str = ""

    @classmethod
    def _decode(cls, d: dict, name: str) -> Faulty:
        return cls(peer=_peer(d, name), suspect=_peer(d, name, "suspect"), iteration=_iteration(d, name),
                   epoch=_epoch(d, name), why=_why(d, name))


@dataclass(frozen=True)
class Admitted:
    """The scheduler admits `peer` to the run: its membership certificate (`swarm.control.membership`), which
    it puts in its peer record and every peer checks."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    cert: bytes

    @classmethod
    def _decode(cls, d: dict, name: str) -> Admitted:
        return cls(peer=_peer(d, name), cert=read_bytes(d.get("cert"), f"{name}.cert", MAX_CERT_BYTES))


@dataclass(frozen=True)
class Refused:
    """The scheduler refuses to admit `peer`, saying why: the joiner stops (it would never be placed). `evicted`:
    the run threw a member out, and every peer takes nothing from it again; a joiner's refusal bans nobody (the
    peer may come back with the right token)."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    why: str
    evicted: bool = False

    @classmethod
    def _decode(cls, d: dict, name: str) -> Refused:
        return cls(peer=_peer(d, name), why=_why(d, name), evicted=_flag(d, "evicted", name))


@dataclass(frozen=True)
class NotDialable:
    """The coordinator dialled back the direct addresses `peer` announces (`tried`) and none took a connection:
    others cannot open one to it either. `relay`: the coordinator relays for peers behind NAT (`--relay`)."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    tried: tuple[str, ...]
    relay: bool = False

    def _fields(self) -> dict[str, Any]:
        return {"peer": self.peer, "tried": list(self.tried), "relay": self.relay}

    @classmethod
    def _decode(cls, d: dict, name: str) -> NotDialable:
        tried = tuple(read_str(a, f"{name}.tried", MAX_ADDRESS_CHARS)
                      for a in read_list(d.get("tried"), f"{name}.tried", MAX_ADDRESSES))
        return cls(peer=_peer(d, name), tried=tried, relay=_flag(d, "relay", name))


@dataclass(frozen=True)
class SitOut:
    """The scheduler leaves `peer` out of the plan for `seconds`: it and `partner`, both of `stage`'s group, reported
    each other unreachable, so they cannot average (`swarm.coordinator.estrangements`)."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    partner: str
    stage: int
    seconds: float

    @classmethod
    def _decode(cls, d: dict, name: str) -> SitOut:
        return cls(peer=_peer(d, name), partner=_peer(d, name, "partner"),
                   stage=read_int(d.get("stage"), f"{name}.stage", 0, MAX_STAGES),
                   seconds=read_float(d.get("seconds"), f"{name}.seconds", 0.0, 86400.0))


@dataclass(frozen=True)
class Benched:
    """The scheduler takes `peer` off the run's work for `seconds`, from `iteration` on (the one in progress goes on
    without it): a data holder the commits kept leaving out for being late even at its smallest share, or a relay
    whose passes stayed far slower than the others' (`swarm.coordinator.benches`). It is not taken for gone, and is
    placed again afterwards."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    iteration: int
    seconds: float

    @classmethod
    def _decode(cls, d: dict, name: str) -> Benched:
        return cls(peer=_peer(d, name), iteration=_iteration(d, name),
                   seconds=read_float(d.get("seconds"), f"{name}.seconds", 0.0, 86400.0))


MAX_NONCE = (1 << 62) - 1


@dataclass(frozen=True)
class Ping:
    """The scheduler asks `peer`, which one peer reported unreachable, whether it is alive: it answers `Pong` with
    the same `nonce` (`swarm.coordinator.pings`)."""

    TOPIC: ClassVar[Topic] = "membership"
    peer: str
    nonce: int

    @classmethod
    def _decode(cls, d: dict, name: str) -> Ping:
        return cls(peer=_peer(d, name), nonce=read_int(d.get("nonce"), f"{name}.nonce", 0, MAX_NONCE))


@dataclass(frozen=True)
class Pong:
    """The sender is alive: its answer to the scheduler's `Ping` with `nonce`."""

    TOPIC: ClassVar[Topic] = "membership"
    nonce: int

    @classmethod
    def _decode(cls, d: dict, name: str) -> Pong:
        return cls(nonce=read_int(d.get("nonce"), f"{name}.nonce", 0, MAX_NONCE))


ControlMessage = Join | Leave | Gone | Finished | Stuck | Broken | Unrecoverable | Unreachable | ScheduleNotice | \
    Alive | Done | Pace | Commit | Faulty | Admitted | Refused | NotDialable | SitOut | Benched | Ping | Pong
MESSAGE_TYPES: dict[str, type] = {cls.__name__.lower(): cls for cls in
                                  (Join, Leave, Gone, Finished, Stuck, Broken, Unrecoverable, Unreachable,
                                   ScheduleNotice, Alive, Done, Pace, Commit, Faulty, Admitted, Refused, NotDialable,
                                   SitOut, Benched, Ping, Pong)}


def encode(message: ControlMessage) -> dict[str, Any]:
    """The gossip payload of `message` (a msgpack-ready map)."""
    fields_of = getattr(message, "_fields", None)
    body = fields_of() if fields_of is not None else {f.name: getattr(message, f.name) for f in fields(message)}
    return {"type": type(message).__name__.lower(), "version": WIRE_VERSION, **body}


def topic_of(message: ControlMessage, run_id: str) -> str:
    """The gossip topic of `run_id` that carries `message`."""
    return _TOPICS[message.TOPIC](run_id)


def publish(gossip: GossipClient, run_id: str, message: ControlMessage, **kwargs: Any) -> None:
    """Gossip `message` on its topic of `run_id` (`kwargs` go to `GossipClient.publish`: wait, timeout)."""
    gossip.publish(topic_of(message, run_id), encode(message), **kwargs)


def as_gossip(message: ControlMessage, run_id: str, sender: str) -> GossipMessage:
    """`message` as gossip would deliver it from `sender`: how a scheduler role hands its own host peer (and a peer
    its own scheduler role) what gossip does not deliver back to its publisher."""
    return GossipMessage(topic=topic_of(message, run_id), sender=sender, seqno=0, payload=encode(message))


def received(msg: GossipMessage, run_id: str) -> ControlMessage:
    """The control message in gossip `msg` of run `run_id`; raises WireError if it is not a valid one for its
    topic (a topic of another run included)."""
    for topic, name in _TOPICS.items():
        if msg.topic == name(run_id):
            return decode(topic, msg.payload)
    raise WireError(f"control: topic {msg.topic!r:.80} is not one of run {run_id!r:.40}")


def decode(topic: Topic, payload: Any) -> ControlMessage:
    """The message in a gossip payload received on `topic`; raises WireError if it is not one that topic carries."""
    d = read_map(payload, "control")
    kind = read_str(d.get("type"), "control.type")
    cls = MESSAGE_TYPES.get(kind)
    if cls is None or cls.TOPIC != topic:
        raise WireError(f"control.type: {kind!r:.40} is not a {topic} message")
    read_version(d, kind)
    try:
        return cls._decode(d, kind)
    except WireError:
        raise
    except (TypeError, ValueError, AttributeError) as e:  # a nested value of a shape no reader expected
        raise WireError(f"{kind}: {type(e).__name__}: {e}") from None
