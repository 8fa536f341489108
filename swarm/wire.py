"""Every record that crosses the network, as frozen dataclasses with explicit msgpack encoding.

Our counterpart of Petals' ``data_structures.py``. Records are msgpack maps with named fields and a ``version``;
decoders trust nothing: strict types (``3.0`` is not an int, ``True`` is not an int), ranges, and sizes are
checked before anything is allocated, and every failure is one :class:`WireError` naming the field. Fields a
decoder does not know are ignored, so newer peers may add optional fields. Enums travel as ints. Tensors travel
as raw bytes described by a :class:`TensorDescriptor` (dtype name, shape); never pickle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch

from scheduler.constants import JITTER_QUANTILES, MAX_JITTER_SECONDS, MAX_PEERS, MAX_STAGES
from scheduler.schedule import Schedule, ScheduleError
from swarm.codec import (  # the rules the records below are decoded by (importers find them here too)
    WireError,
    pack,
    read_bytes,
    read_choice,
    read_float,
    read_int,
    read_list,
    read_map,
    read_plain,
    read_str,
    read_version,
    unpack,
)
from swarm.constants import (
    COMPRESSION_DTYPES,
    MAX_ADDRESS_CHARS,
    MAX_ADDRESSES,
    MAX_CERT_BYTES,
    MAX_CHUNKS,
    MAX_HEADER_BYTES,
    MAX_LINEAGE_BYTES,
    MAX_LINKS,
    MAX_MICROBATCH_ATTEMPTS,
    MAX_PROOF_BYTES,
    MAX_RECORD_BYTES,
    MAX_ROUTE_HOPS,
    MAX_SCHEDULE_BYTES,
    MAX_TENSOR_BYTES,
    MAX_TENSOR_NDIM,
    RESTORE_DTYPES,
    WIRE_DTYPES,
    WIRE_VERSION,
)

ADMISSION_MODES = ("token", "allow", "open")
REACHABILITY_VALUES = ("", "public", "relayed", "unreachable")
_TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in WIRE_DTYPES}
_DTYPE_NAMES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}


# ---- tensors ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorDescriptor:
    """What a receiver needs to know before reading a tensor's raw bytes, like hivemind's TensorDescriptor."""

    dtype: str
    """torch dtype name, one of ``swarm.constants.WIRE_DTYPES``."""
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * _TORCH_DTYPES[self.dtype].itemsize

    def check(self, *, max_bytes: int = MAX_TENSOR_BYTES, max_ndim: int = MAX_TENSOR_NDIM) -> TensorDescriptor:
        """Raise :class:`WireError` unless dtype, rank and byte size are within limits; returns self."""
        if type(self.dtype) is not str or self.dtype not in _TORCH_DTYPES:
            raise WireError(f"dtype {self.dtype!r:.40} is not one of {', '.join(WIRE_DTYPES)}")
        if type(self.shape) is not tuple or len(self.shape) > max_ndim:
            raise WireError(f"shape must be a tuple of at most {max_ndim} dimensions")
        for i, n in enumerate(self.shape):
            read_int(n, f"shape[{i}]", 0, max_bytes)
        if self.nbytes > max_bytes:
            raise WireError(f"tensor of {self.nbytes} bytes ({self.dtype}{list(self.shape)}) exceeds the limit "
                            f"of {max_bytes}")
        return self

    def to_msgpack(self) -> bytes:
        return pack(self._fields())

    def _fields(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_msgpack(cls, data: bytes, *, max_bytes: int = MAX_TENSOR_BYTES) -> TensorDescriptor:
        return cls._from_fields(read_map(unpack(data, max_bytes=MAX_HEADER_BYTES), "tensor"), "tensor", max_bytes)

    @classmethod
    def _from_fields(cls, d: dict, name: str, max_bytes: int) -> TensorDescriptor:
        dtype = read_str(d.get("dtype"), f"{name}.dtype", 16)
        shape = tuple(read_list(d.get("shape"), f"{name}.shape", MAX_TENSOR_NDIM))
        return cls(dtype=dtype, shape=shape).check(max_bytes=max_bytes)


def encode_tensor(tensor: torch.Tensor, *, wire_dtype: str | None = None) -> tuple[TensorDescriptor, memoryview]:
    """Describe ``tensor`` and expose its raw bytes (no copy when it is already contiguous on the CPU).

    :param wire_dtype: "float16" or "bfloat16" to cast a floating tensor for the wire (halves float32's bytes);
      None sends it as is. Integer tensors are never cast.
    :returns: the descriptor and a byte view that stays valid while the returned view is referenced
    """
    if wire_dtype is not None:
        if wire_dtype not in COMPRESSION_DTYPES:
            raise ValueError(f"wire_dtype must be one of {COMPRESSION_DTYPES} or None, got {wire_dtype!r}")
        if tensor.is_floating_point():
            tensor = tensor.to(_TORCH_DTYPES[wire_dtype])
    if tensor.dtype not in _DTYPE_NAMES:
        raise ValueError(f"dtype {tensor.dtype} cannot travel on the wire; allowed: {', '.join(WIRE_DTYPES)}")
    tensor = tensor.detach().cpu().contiguous()
    desc = TensorDescriptor(dtype=_DTYPE_NAMES[tensor.dtype], shape=tuple(tensor.shape))
    if tensor.dtype == torch.bool:
        tensor = tensor.view(torch.uint8)
    return desc, memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def decode_tensor(desc: TensorDescriptor, data: bytes | bytearray | memoryview, *,
                  max_bytes: int = MAX_TENSOR_BYTES) -> torch.Tensor:
    """Rebuild a tensor from its descriptor and raw bytes; raises :class:`WireError` on any mismatch.

    Shares memory with ``data`` when it is a writable buffer (a ``bytearray`` the receiver filled), else copies.
    """
    desc.check(max_bytes=max_bytes)
    if len(data) != desc.nbytes:
        raise WireError(f"tensor {desc.dtype}{list(desc.shape)} needs {desc.nbytes} bytes, got {len(data)}")
    dtype = _TORCH_DTYPES[desc.dtype]
    if desc.numel == 0:
        return torch.empty(desc.shape, dtype=dtype)
    buffer = data if isinstance(data, bytearray) else bytearray(data)
    if dtype == torch.bool:  # bytes other than 0/1 would make invalid bools
        raw = torch.frombuffer(buffer, dtype=torch.uint8)
        if bool((raw > 1).any()):
            raise WireError("bool tensor holds bytes other than 0 and 1")
        return raw.view(torch.bool).reshape(desc.shape)
    return torch.frombuffer(buffer, dtype=dtype).reshape(desc.shape)


def check_restore(wire_dtype: str, restore_dtype: str) -> None:
    """Raise :class:`WireError` unless casting a `wire_dtype` tensor to `restore_dtype` only undoes wire compression.

    The sender names the dtype it computed in (``HopHeader.restore_dtype``) and the receiver casts back to it, so
    an unchecked name would let 64 MiB of uint8 become a 512 MiB float64 tensor after every size check. Allowed:
    from a compression dtype (float16, bfloat16) to another float of ``RESTORE_DTYPES`` (at most twice the bytes).
    """
    if wire_dtype not in COMPRESSION_DTYPES:
        raise WireError(f"restore_dtype {restore_dtype!r:.40}: a {wire_dtype} tensor was not compressed for the wire")
    if restore_dtype not in RESTORE_DTYPES or restore_dtype == wire_dtype:
        raise WireError(f"restore_dtype {restore_dtype!r:.40}: a {wire_dtype} tensor casts back only to one of "
                        f"{', '.join(d for d in RESTORE_DTYPES if d != wire_dtype)}")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a wire dtype name; raises :class:`WireError` for names not allowed on the wire."""
    if name not in _TORCH_DTYPES:
        raise WireError(f"dtype {name!r:.40} is not one of {', '.join(WIRE_DTYPES)}")
    return _TORCH_DTYPES[name]


# ---- hop header -------------------------------------------------------------------------------------------------
class Direction(IntEnum):
    FORWARD = 0
    BACKWARD = 1
    AVERAGE = 2
    """A stage peer's summed gradients for its group's all-gather (route = (sender, receiver))."""
    STATE = 3
    """A stage's weights or optimizer moments for a peer joining that stage (route = (sender, receiver))."""


class AverageStep(IntEnum):
    """What an AVERAGE message carries (`HopHeader.average_step`; `swarm.stage_group`)."""

    WHOLE = 0
    """A member's whole flattened gradient sum, for every other member (the all-gather)."""
    PIECE = 1
    """A member's piece of part `microbatch` of its gradient sum, for the part's two owners (averaging by parts)."""
    PART_MEAN = 2
    """An owner's combination of part `microbatch`'s pieces, for every other member; `lineage` = its inputs' digest."""
    BALLOT = 3
    """The parts a member could not take (one uint8 flag per part), for every other member."""
    FALLBACK = 4
    """A member's piece of a part somebody could not take, for every other member, who combine it themselves."""


@dataclass(frozen=True)
class HopHeader:
    """Travels in front of every activation or gradient, so a relay needs no global state to forward it.

    ``route[0]`` is the origin (the data holder); ``route[hop]`` is the peer this message is addressed to.
    Forward messages walk the route up, backward messages walk it down to hop 0.
    """

    run: str
    iteration: int
    microbatch: int
    route: tuple[str, ...]
    hop: int
    direction: Direction
    epoch: int
    dtype: str
    shape: tuple[int, ...]
    stages: tuple[int, ...] = ()
    """Stage served at each hop of ``route`` (empty = not sent)."""
    restore_dtype: str = ""
    """dtype the sender computed in, when it cast the tensor for the wire; empty = none (see `check_restore`)."""
    weight: int = 0
    """AVERAGE messages: microbatches behind the gradient sum (its weight in the group mean)."""
    sent_at: float = 0.0
    """Sender's wall clock when the message left its pipeline (0 = not stamped): the receiver measures jitter from
    it against the link's median, so the clocks need not agree."""
    attempt: int = 0
    """How many times the data holder re-queued this microbatch in this iteration (a peer on its path died):
    messages of an earlier attempt are stale."""
    counted: tuple[int, ...] = ()
    """Stages whose gradient already holds this microbatch (from an earlier attempt): they backpropagate it
    without accumulating."""
    lineage: bytes = b""
    """AVERAGE messages: the sender's stage copy's lineage (`swarm.stage_group.lineage`; empty = unknown)."""
    chunk: int = 0
    chunks: int = 1
    """AVERAGE and STATE messages too large for one message travel as `chunks` pieces, this one number `chunk`
    (`swarm.peer.message_chunks`)."""
    average_step: AverageStep = AverageStep.WHOLE
    """AVERAGE messages: what the tensor is (`AverageStep`); `microbatch` numbers the part where it is one."""
    version: int = WIRE_VERSION

    @property
    def origin(self) -> str:
        return self.route[0]

    @property
    def target(self) -> str:
        return self.route[self.hop]

    @property
    def descriptor(self) -> TensorDescriptor:
        return TensorDescriptor(dtype=self.dtype, shape=self.shape)

    def to_msgpack(self) -> bytes:
        d = {
            "version": self.version, "run": self.run, "iteration": self.iteration, "microbatch": self.microbatch,
            "route": list(self.route), "hop": self.hop, "direction": int(self.direction), "epoch": self.epoch,
            "dtype": self.dtype, "shape": list(self.shape),
        }
        if self.stages:
            d["stages"] = list(self.stages)
        if self.restore_dtype:
            d["restore_dtype"] = self.restore_dtype
        if self.weight:
            d["weight"] = self.weight
        if self.sent_at:
            d["sent_at"] = self.sent_at
        if self.attempt:
            d["attempt"] = self.attempt
        if self.counted:
            d["counted"] = list(self.counted)
        if self.lineage:
            d["lineage"] = self.lineage
        if self.chunks != 1:
            d["chunk"], d["chunks"] = self.chunk, self.chunks
        if self.average_step:
            d["average_step"] = int(self.average_step)
        return pack(d)

    @classmethod
    def from_msgpack(cls, data: bytes, *, max_tensor_bytes: int = MAX_TENSOR_BYTES) -> HopHeader:
        """Decode and check a header, including that its tensor fits ``max_tensor_bytes``."""
        d = read_map(unpack(data, max_bytes=MAX_HEADER_BYTES), "header")
        version = read_version(d, "header")
        route = tuple(read_str(p, "header.route[]") for p in read_list(d.get("route"), "header.route", MAX_ROUTE_HOPS))
        if not route:
            raise WireError("header.route: empty")
        stages = tuple(read_int(s, "header.stages[]", 0, MAX_STAGES - 1)
                       for s in read_list(d.get("stages", []), "header.stages", MAX_ROUTE_HOPS))
        if stages and len(stages) != len(route):
            raise WireError(f"header.stages: {len(stages)} stages for a route of {len(route)} peers")
        direction = read_int(d.get("direction"), "header.direction", 0, len(Direction) - 1)
        restore = read_str(d.get("restore_dtype", ""), "header.restore_dtype", 16, allow_empty=True)
        chunks = read_int(d.get("chunks", 1), "header.chunks", 1, MAX_CHUNKS)
        desc = TensorDescriptor._from_fields(d, "header", max_tensor_bytes)
        if restore:
            check_restore(desc.dtype, restore)
        return cls(
            run=read_str(d.get("run"), "header.run"),
            iteration=read_int(d.get("iteration"), "header.iteration", 0),
            microbatch=read_int(d.get("microbatch"), "header.microbatch", 0),
            route=route,
            hop=read_int(d.get("hop"), "header.hop", 0, len(route) - 1),
            direction=Direction(direction),
            epoch=read_int(d.get("epoch"), "header.epoch", 0),
            dtype=desc.dtype,
            shape=desc.shape,
            stages=stages,
            restore_dtype=restore,
            weight=read_int(d.get("weight", 0), "header.weight", 0, 1 << 40),
            sent_at=read_float(d.get("sent_at", 0.0), "header.sent_at", 0.0, 1e11),
            attempt=read_int(d.get("attempt", 0), "header.attempt", 0, MAX_MICROBATCH_ATTEMPTS),
            counted=tuple(read_int(s, "header.counted[]", 1, MAX_STAGES - 1)
                          for s in read_list(d.get("counted", []), "header.counted", MAX_STAGES)),
            lineage=read_bytes(d.get("lineage", b""), "header.lineage", MAX_LINEAGE_BYTES),
            chunk=read_int(d.get("chunk", 0), "header.chunk", 0, chunks - 1),
            chunks=chunks,
            average_step=AverageStep(read_int(d.get("average_step", 0), "header.average_step", 0,
                                              len(AverageStep) - 1)),
            version=version,
        )


# ---- peer record ------------------------------------------------------------------------------------------------
class PeerState(IntEnum):
    JOINING = 0
    ONLINE = 1
    LEAVING = 2
    DRAINING = 3
    """Asked to stop: it serves until the scheduler plans without it, hands its stage's state over if nobody else
    holds it, then leaves (a graceful leave)."""


@dataclass(frozen=True)
class PeerRecord:
    """What a peer announces in the DHT each heartbeat; the scheduler's view of the swarm is built from these."""

    peer_id: str
    stage: int
    """Stage it serves; -1 = not placed yet."""
    seconds_per_layer: float
    """Measured forward time of one decoder layer for one microbatch."""
    memory_slots: int
    links: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Peer id -> (latency seconds, goodput bytes/s), smoothed measurements to a sample of peers."""
    addresses: tuple[str, ...] = ()
    """Multiaddrs it can be reached at."""
    state: PeerState = PeerState.JOINING
    data_holder: bool = False
    """Holds a data shard, so it is pinned to stage 0."""
    control_addrs: tuple[str, ...] = ()
    """Multiaddrs of its gossip sidecar, so peers stay connected on the control plane without the coordinator."""
    loss_seconds: float = 0.0
    """Measured time of the loss step (LM head, loss and its backward) for one microbatch; 0 = not measured."""
    jitter: tuple[float, ...] = ()
    """Quantiles (seconds) of how much the messages it received deviated from their link's median; () = not yet
    measured (`swarm.net.message_jitter`)."""
    admission: bytes = b""
    """Its proof of the run's join token (`swarm.control.membership.token_proof`), until it is admitted."""
    cert: bytes = b""
    """Its membership certificate, issued by the scheduler once it was admitted (`MembershipCert`)."""
    reachability: str = ""
    """"public" (it can be dialled), "relayed" (behind NAT: reached through the /p2p-circuit addresses among its
    `addresses`), "unreachable" (neither: the coordinator's dial-back found that none of its direct addresses takes a
    connection), or "" (not said or not known). Optional on the wire (`swarm.net.reachability`)."""
    unreachable: tuple[str, ...] = ()
    """Peers its link probes could not reach at their last try (no stream opened or no answer): those links are
    known, not waited for. Optional on the wire."""
    version: int = WIRE_VERSION

    def to_msgpack(self) -> bytes:
        return pack({
            "version": self.version, "peer_id": self.peer_id, "stage": self.stage, "admission": self.admission,
            "cert": self.cert,
            "seconds_per_layer": self.seconds_per_layer, "memory_slots": self.memory_slots,
            "loss_seconds": self.loss_seconds,
            "links": {p: [float(lat), float(bw)] for p, (lat, bw) in self.links.items()},
            "addresses": list(self.addresses), "state": int(self.state), "data_holder": self.data_holder,
            "control_addrs": list(self.control_addrs),
            **({"jitter": [float(j) for j in self.jitter]} if self.jitter else {}),
            **({"reachability": self.reachability} if self.reachability else {}),
            **({"unreachable": list(self.unreachable)} if self.unreachable else {}),
        })

    @classmethod
    def from_msgpack(cls, data: bytes) -> PeerRecord:
        d = read_map(unpack(data), "peer")
        version = read_version(d, "peer")
        links = {}
        links_raw = read_map(d.get("links", {}), "peer.links")
        if len(links_raw) > MAX_LINKS:
            raise WireError(f"peer.links: {len(links_raw)} links exceed the limit of {MAX_LINKS}")
        for p, v in links_raw.items():
            read_str(p, "peer.links key")
            pair = read_list(v, f"peer.links[{p}]", 2)
            if len(pair) != 2:
                raise WireError(f"peer.links[{p}]: expected [latency_s, bytes_per_s]")
            links[p] = (read_float(pair[0], f"peer.links[{p}].latency", 0.0, 3600.0),
                        read_float(pair[1], f"peer.links[{p}].bytes_per_s", 1e-9, 1e15))
        addresses = tuple(read_str(a, "peer.addresses[]", MAX_ADDRESS_CHARS)
                          for a in read_list(d.get("addresses", []), "peer.addresses", MAX_ADDRESSES))
        data_holder = d.get("data_holder", False)
        if type(data_holder) is not bool:
            raise WireError("peer.data_holder: expected a bool")
        return cls(
            peer_id=read_str(d.get("peer_id"), "peer.peer_id"),
            stage=read_int(d.get("stage"), "peer.stage", -1, MAX_STAGES - 1),
            seconds_per_layer=read_float(d.get("seconds_per_layer"), "peer.seconds_per_layer", 1e-9, 3600.0),
            memory_slots=read_int(d.get("memory_slots"), "peer.memory_slots", 1, 1 << 20),
            loss_seconds=read_float(d.get("loss_seconds", 0.0), "peer.loss_seconds", 0.0, 3600.0),
            links=links,
            addresses=addresses,
            state=PeerState(read_int(d.get("state"), "peer.state", 0, len(PeerState) - 1)),
            data_holder=data_holder,
            control_addrs=tuple(read_str(a, "peer.control_addrs[]", MAX_ADDRESS_CHARS)
                                for a in read_list(d.get("control_addrs", []), "peer.control_addrs", MAX_ADDRESSES)),
            jitter=tuple(read_float(j, "peer.jitter[]", -MAX_JITTER_SECONDS, MAX_JITTER_SECONDS)
                         for j in read_list(d.get("jitter", []), "peer.jitter", JITTER_QUANTILES)),
            admission=read_bytes(d.get("admission", b""), "peer.admission", MAX_PROOF_BYTES),
            cert=read_bytes(d.get("cert", b""), "peer.cert", MAX_CERT_BYTES),
            reachability=read_choice(d.get("reachability", ""), "peer.reachability", REACHABILITY_VALUES),
            unreachable=tuple(read_str(p, "peer.unreachable[]")
                              for p in read_list(d.get("unreachable", []), "peer.unreachable", MAX_LINKS)),
            version=version,
        )


# ---- run spec ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """What a run is, published by its coordinator; peers read it as data, never run it as code."""

    run_id: str
    model: dict[str, Any]
    """Model config as plain data (e.g. ``dataclasses.asdict`` of the model config)."""
    stages: int
    skip_ratio: float
    hyperparameters: dict[str, Any]
    data: dict[str, Any]
    coordinator: str
    """Peer id of the coordinator, whose key signs the spec and (by default) the schedules."""
    control_addrs: tuple[str, ...] = ()
    """Multiaddrs of the coordinator's gossip sidecar: where peers join the control plane."""
    admission: str = "token"
    """Who the run admits: "token" (holders of its join token), "allow" (the peer ids in `allowed`, and token
    holders) or "open" (anyone)."""
    allowed: tuple[str, ...] = ()
    version: int = WIRE_VERSION

    def to_msgpack(self) -> bytes:
        return pack({
            "version": self.version, "run_id": self.run_id, "model": self.model, "stages": self.stages,
            "skip_ratio": self.skip_ratio, "hyperparameters": self.hyperparameters, "data": self.data,
            "coordinator": self.coordinator, "control_addrs": list(self.control_addrs),
            "admission": self.admission, "allowed": list(self.allowed),
        })

    @classmethod
    def from_msgpack(cls, data: bytes) -> RunSpec:
        d = read_map(unpack(data), "run")
        return cls(
            run_id=read_str(d.get("run_id"), "run.run_id"),
            model=read_plain(d.get("model"), "run.model"),
            stages=read_int(d.get("stages"), "run.stages", 1, MAX_STAGES),
            skip_ratio=read_float(d.get("skip_ratio"), "run.skip_ratio", 0.0, 0.999),
            hyperparameters=read_plain(d.get("hyperparameters"), "run.hyperparameters"),
            data=read_plain(d.get("data"), "run.data"),
            coordinator=read_str(d.get("coordinator"), "run.coordinator"),
            control_addrs=tuple(read_str(a, "run.control_addrs[]", MAX_ADDRESS_CHARS)
                                for a in read_list(d.get("control_addrs", []), "run.control_addrs", 16)),
            admission=read_choice(d.get("admission", "token"), "run.admission", ADMISSION_MODES),
            allowed=tuple(read_str(p, "run.allowed[]") for p in read_list(d.get("allowed", []), "run.allowed",
                                                                         MAX_PEERS)),
            version=read_version(d, "run"),
        )


# ---- schedule ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScheduleMsg:
    """A schedule epoch on the wire: the plain dict of ``scheduler.schedule.Schedule.to_dict()``.

    `bridge` is the epoch in force for the iteration in progress when this one starts after it, and that epoch only
    started at that iteration: the DHT keeps one schedule per signer, so this record replaced it, and a peer that had
    not read it yet would otherwise run that iteration under the epoch before, which the others refuse."""

    epoch: int
    schedule: dict[str, Any]
    bridge: dict[str, Any] | None = None
    version: int = WIRE_VERSION

    @classmethod
    def from_schedule(cls, schedule: Schedule, bridge: Schedule | None = None) -> ScheduleMsg:
        return cls(epoch=schedule.epoch, schedule=schedule.to_dict(),
                   bridge=bridge.to_dict() if bridge is not None else None)

    def to_schedule(self) -> Schedule:
        """The parsed schedule; raises :class:`WireError` if the dict is not a valid schedule."""
        return _parse_schedule(self.schedule, "schedule")

    def to_bridge(self) -> Schedule | None:
        """The parsed bridge epoch, if any; raises :class:`WireError` if it is not a valid schedule."""
        return None if self.bridge is None else _parse_schedule(self.bridge, "schedule_msg.bridge")

    def to_msgpack(self) -> bytes:
        d = {"version": self.version, "epoch": self.epoch, "schedule": self.schedule}
        if self.bridge is not None:
            d["bridge"] = self.bridge
        return pack(d)

    @classmethod
    def from_msgpack(cls, data: bytes, *, max_bytes: int | None = None) -> ScheduleMsg:
        d = read_map(unpack(data, max_bytes=max_bytes or MAX_SCHEDULE_BYTES), "schedule_msg")
        bridge = d.get("bridge")
        msg = cls(epoch=read_int(d.get("epoch"), "schedule_msg.epoch", 0),
                  schedule=read_map(d.get("schedule"), "schedule"),
                  bridge=None if bridge is None else read_map(bridge, "schedule_msg.bridge"),
                  version=read_version(d, "schedule_msg"))
        schedule = msg.to_schedule()
        if schedule.epoch != msg.epoch:
            raise WireError(f"schedule_msg.epoch {msg.epoch} differs from the schedule's epoch")
        start, before = _start(schedule), msg.to_bridge()
        if before is not None and not (before.epoch < schedule.epoch and _start(before) < start):
            raise WireError(f"schedule_msg.bridge: epoch {before.epoch} from iteration {_start(before)} does not "
                            f"come before epoch {schedule.epoch} from iteration {start}")
        return msg


def _parse_schedule(d: dict[str, Any], name: str) -> Schedule:
    try:
        return Schedule.from_dict(d)
    except (ScheduleError, ValueError, TypeError, KeyError) as e:  # from_dict should only raise ScheduleError
        raise WireError(f"{name}: {e}") from None


def _start(schedule: Schedule) -> int:
    start = schedule.meta.get("start_iteration", 0)
    if type(start) is not int or start < 0:
        raise WireError(f"schedule epoch {schedule.epoch}: start_iteration must be a non-negative int, got {start!r}")
    return start


# ---- signed envelope --------------------------------------------------------------------------------------------
MAX_PUBLIC_KEY_BYTES = 4096
MAX_SIGNATURE_BYTES = 4096


@dataclass(frozen=True)
class SignedRecord:
    """A record body signed by its author, as stored in the DHT.

    The signature covers :meth:`signed_bytes`: the kind, run, DHT subkey, absolute expiry and body, so a record
    cannot be replayed under another key, run or subkey, nor kept alive past the expiry its author chose.
    """

    kind: str
    """"run", "peer" or "schedule"."""
    body: bytes
    """The msgpack of the record (RunSpec, PeerRecord or ScheduleMsg)."""
    expires: float
    """Absolute expiry (``hivemind.get_dht_time()`` clock) chosen and signed by the author."""
    public_key: bytes
    """The author's RSA public key, OpenSSH form (its peer id is derived from it)."""
    signature: bytes
    proof: bytes = b""
    """The author's proof of the run's join token (`swarm.control.membership.token_proof`), so that a DHT node
    can refuse the records of strangers before storing them (`swarm.control.record_writers`). Outside the signed
    bytes: the proof is bound to the author's peer id already, so it is worth nothing on another author's record.
    Optional on the wire."""
    version: int = WIRE_VERSION

    @staticmethod
    def signed_bytes(kind: str, run_id: str, subkey: str, expires: float, body: bytes) -> bytes:
        return pack(["skippipe.record", WIRE_VERSION, kind, run_id, subkey, float(expires), body])

    def to_msgpack(self) -> bytes:
        return pack({"version": self.version, "kind": self.kind, "body": self.body, "expires": self.expires,
                     "key": self.public_key, "sig": self.signature, **({"proof": self.proof} if self.proof else {})})

    @classmethod
    def from_msgpack(cls, data: bytes, *, max_bytes: int = MAX_RECORD_BYTES) -> SignedRecord:
        d = read_map(unpack(data, max_bytes=max_bytes), "record")
        version = read_version(d, "record")
        fields = {}
        for name, limit in (("body", max_bytes), ("key", MAX_PUBLIC_KEY_BYTES), ("sig", MAX_SIGNATURE_BYTES)):
            value = d.get(name)
            if type(value) is not bytes or len(value) > limit:
                raise WireError(f"record.{name}: expected at most {limit} bytes, got {type(value).__name__}")
            fields[name] = value
        return cls(kind=read_str(d.get("kind"), "record.kind", 32), body=fields["body"],
                   expires=read_float(d.get("expires"), "record.expires", 0.0), public_key=fields["key"],
                   signature=fields["sig"], proof=read_bytes(d.get("proof", b""), "record.proof", MAX_PROOF_BYTES),
                   version=version)
