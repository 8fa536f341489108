"""The schedule: which peer holds which stage, and the route of every microbatch of one iteration.

Versioned and numbered by epoch, so peers can refuse stale or foreign formats and switch epochs at
an iteration boundary. `to_dict`/`from_dict` give plain data (the swarm packs it with msgpack; people
read it as JSON). `from_dict` trusts nothing: types, ranges and sizes are checked before anything is
built, and `validate` checks every rule of the method, naming the microbatch, the hop and the rule.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scheduler.constants import MAX_MICROBATCHES, MAX_PEERS, MAX_STAGES, SCHEDULE_FORMAT_VERSION
from scheduler.path_rules import PathRules, path_violation


class ScheduleError(ValueError):
    """A schedule that is malformed or breaks a rule of the method."""


@dataclass(frozen=True)
class Route:
    """One microbatch's path: out of its data holder, through `peers` (one per stage), and back."""

    microbatch: int
    """Unique id of the microbatch within the iteration."""
    origin: str
    """The data holder (a stage-0 peer) that injects it, computes its loss and ends its backward."""
    stages: tuple[int, ...]
    """Non-zero stages visited, in order."""
    peers: tuple[str, ...]
    """The peer serving each of `stages`."""
    inject_after: float = 0.0
    """Planned injection time at the origin, seconds after the iteration starts (a hint, not a deadline)."""

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every peer on the forward route, the origin first (the route then returns to the origin)."""
        return (self.origin, *self.peers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "microbatch": self.microbatch,
            "origin": self.origin,
            "stages": list(self.stages),
            "peers": list(self.peers),
            "inject_after": self.inject_after,
        }


@dataclass(frozen=True)
class Schedule:
    """A complete plan for one epoch of the run: placement, per-peer memory, every route."""

    epoch: int
    """Increases with every re-plan; peers switch to a newer epoch at an iteration boundary."""
    rules: PathRules
    placement: dict[str, int]
    """Peer id -> stage it serves."""
    memory: dict[str, int]
    """Peer id -> activations it may hold awaiting backward (TC1)."""
    routes: tuple[Route, ...]
    run_id: str = ""
    predicted_iteration_seconds: float | None = None
    """The simulator's makespan for this plan on the swarm view it was planned for."""
    planner: str = ""
    """Which planner made it (`skippipe`, `full_pipeline`, `random_skip`, `reference`, ...)."""
    version: int = SCHEDULE_FORMAT_VERSION
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form, JSON-safe notes (seed, plan time); never needed to execute the schedule."""

    # ---- derived views -------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return self.rules.num_stages

    def stage_peers(self, stage: int) -> list[str]:
        """Peers serving `stage`, in a stable order."""
        return sorted(p for p, s in self.placement.items() if s == stage)

    @property
    def data_holders(self) -> list[str]:
        return self.stage_peers(0)

    def routes_from(self, origin: str) -> list[Route]:
        return [r for r in self.routes if r.origin == origin]

    def visits(self) -> Counter[str]:
        """Microbatches each peer processes per iteration (a data holder counts its own)."""
        count: Counter[str] = Counter()
        for r in self.routes:
            count[r.origin] += 1
            count.update(r.peers)
        return count

    def stage_visits(self) -> Counter[int]:
        count: Counter[int] = Counter()
        for r in self.routes:
            count.update(r.stages)
        return count

    # ---- plain data ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "epoch": self.epoch,
            "run_id": self.run_id,
            "planner": self.planner,
            "rules": {
                "num_stages": self.rules.num_stages,
                "stages_per_path": self.rules.stages_per_path,
                "max_swaps": self.rules.max_swaps,
                "max_swap_distance": self.rules.max_swap_distance,
                "max_jump": self.rules.max_jump,
                "unserved": sorted(self.rules.unserved),
            },
            "placement": dict(sorted(self.placement.items())),
            "memory": dict(sorted(self.memory.items())),
            "routes": [r.to_dict() for r in self.routes],
            "predicted_iteration_seconds": self.predicted_iteration_seconds,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Schedule:
        """Build a schedule from untrusted plain data; raises ScheduleError naming the bad field."""
        d = _expect(data, dict, "schedule")
        version = _int(d.get("version"), "version")
        if version != SCHEDULE_FORMAT_VERSION:
            raise ScheduleError(f"schedule format version {version} is not supported (this build reads "
                                f"version {SCHEDULE_FORMAT_VERSION})")
        r = _expect(d.get("rules"), dict, "rules")
        unserved_raw = _expect(r.get("unserved", []), list, "rules.unserved")
        if len(unserved_raw) > MAX_STAGES:
            raise ScheduleError(f"rules.unserved lists {len(unserved_raw)} stages, the limit is {MAX_STAGES}")
        unserved = frozenset(_int(v, "rules.unserved[]", 1, MAX_STAGES) for v in unserved_raw)
        try:
            rules = PathRules(
                num_stages=_int(r.get("num_stages"), "rules.num_stages", 1, MAX_STAGES),
                stages_per_path=_int(r.get("stages_per_path"), "rules.stages_per_path", 1, MAX_STAGES),
                max_swaps=_int(r.get("max_swaps"), "rules.max_swaps", 0, MAX_STAGES),
                max_swap_distance=_int(r.get("max_swap_distance"), "rules.max_swap_distance", 0, MAX_STAGES),
                max_jump=_int(r.get("max_jump"), "rules.max_jump", 1, MAX_STAGES),
                unserved=unserved,
            )
        except ValueError as e:
            raise ScheduleError(f"rules: {e}") from None
        placement_raw = _expect(d.get("placement"), dict, "placement")
        if len(placement_raw) > MAX_PEERS:
            raise ScheduleError(f"placement has {len(placement_raw)} peers, the limit is {MAX_PEERS}")
        placement = {_str(k, "placement key"): _int(v, f"placement[{k}]", 0, MAX_STAGES) for k, v in
                     placement_raw.items()}
        memory_raw = _expect(d.get("memory"), dict, "memory")
        if len(memory_raw) > MAX_PEERS:
            raise ScheduleError(f"memory has {len(memory_raw)} peers, the limit is {MAX_PEERS}")
        memory = {_str(k, "memory key"): _int(v, f"memory[{k}]", 0, 1 << 20) for k, v in memory_raw.items()}
        routes_raw = _expect(d.get("routes"), list, "routes")
        if len(routes_raw) > MAX_MICROBATCHES:
            raise ScheduleError(f"{len(routes_raw)} routes exceed the limit of {MAX_MICROBATCHES}")
        routes = []
        for i, rr in enumerate(routes_raw):
            rd = _expect(rr, dict, f"routes[{i}]")
            stages = _expect(rd.get("stages"), list, f"routes[{i}].stages")
            peers = _expect(rd.get("peers"), list, f"routes[{i}].peers")
            if len(stages) > MAX_STAGES or len(peers) > MAX_STAGES:
                raise ScheduleError(f"routes[{i}] is longer than {MAX_STAGES} hops")
            routes.append(Route(
                microbatch=_int(rd.get("microbatch"), f"routes[{i}].microbatch", 0, 1 << 62),
                origin=_str(rd.get("origin"), f"routes[{i}].origin"),
                stages=tuple(_int(s, f"routes[{i}].stages", 0, MAX_STAGES) for s in stages),
                peers=tuple(_str(p, f"routes[{i}].peers") for p in peers),
                inject_after=_float(rd.get("inject_after", 0.0), f"routes[{i}].inject_after"),
            ))
        predicted = d.get("predicted_iteration_seconds")
        meta = d.get("meta", {})
        return cls(
            epoch=_int(d.get("epoch"), "epoch", 0, 1 << 62),
            rules=rules,
            placement=placement,
            memory=memory,
            routes=tuple(routes),
            run_id=_str(d.get("run_id", ""), "run_id", allow_empty=True),
            predicted_iteration_seconds=None if predicted is None else _float(predicted,
                                                                             "predicted_iteration_seconds"),
            planner=_str(d.get("planner", ""), "planner", allow_empty=True),
            version=version,
            meta=_expect(meta, dict, "meta"),
        )

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScheduleError(f"schedule is not valid JSON: {e}") from None
        return cls.from_dict(data)


def validate(schedule: Schedule, *, balance_tolerance: int | None = 1) -> None:
    """Raise ScheduleError if `schedule` breaks any rule of the method.

    Checks: placement stages in range, memory >= 1 for every placed peer, every origin a stage-0
    peer, every hop served by a placed peer of that hop's stage, each path valid under the rules
    (length, distinct stages, swaps, jumps), unique microbatch ids, and (unless `balance_tolerance` is
    None) that non-zero stages' visit counts differ by at most `balance_tolerance`.
    """
    rules = schedule.rules
    for peer, stage in schedule.placement.items():
        if not 0 <= stage < rules.num_stages:
            raise ScheduleError(f"peer {peer}: stage {stage} outside 0..{rules.num_stages - 1} (rule: placement)")
        if schedule.memory.get(peer, 0) < 1:
            raise ScheduleError(f"peer {peer}: memory slots must be >= 1 (rule: TC1 memory)")
    seen: set[int] = set()
    for r in schedule.routes:
        mb = f"microbatch {r.microbatch}"
        if r.microbatch in seen:
            raise ScheduleError(f"{mb}: id used twice (rule: unique microbatch ids)")
        seen.add(r.microbatch)
        if schedule.placement.get(r.origin) != 0:
            raise ScheduleError(f"{mb}, hop 0: origin {r.origin} is not a stage-0 peer (rule: stage 0 first and last)")
        if len(r.stages) != len(r.peers):
            raise ScheduleError(f"{mb}: {len(r.stages)} stages but {len(r.peers)} peers (rule: one peer per hop)")
        why = path_violation(r.stages, rules)
        if why is not None:
            raise ScheduleError(f"{mb}, {why}")
        for hop, (stage, peer) in enumerate(zip(r.stages, r.peers), start=1):
            if peer not in schedule.placement:
                raise ScheduleError(f"{mb}, hop {hop}: unknown peer {peer} (rule: placed peers only)")
            if schedule.placement[peer] != stage:
                raise ScheduleError(
                    f"{mb}, hop {hop}: peer {peer} serves stage {schedule.placement[peer]}, not {stage} "
                    "(rule: hop served by its stage)"
                )
    if balance_tolerance is not None and schedule.routes and rules.num_stages > 1:
        counts = schedule.stage_visits()
        served = {s for s in schedule.placement.values() if s > 0}
        per_stage = [counts.get(s, 0) for s in sorted(served)]
        if per_stage and max(per_stage) - min(per_stage) > balance_tolerance:
            detail = ", ".join(f"stage {s}: {counts.get(s, 0)}" for s in sorted(served))
            raise ScheduleError(f"stage visits unbalanced beyond {balance_tolerance} ({detail}) (rule: stage balance)")


# ---- strict readers for untrusted plain data ----------------------------------------------
def _expect(value: Any, kind: type, name: str) -> Any:
    if not isinstance(value, kind):
        raise ScheduleError(f"{name}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _int(value: Any, name: str, lo: int | None = None, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ScheduleError(f"{name}: expected an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ScheduleError(f"{name}: {value} outside {lo}..{hi}")
    return value


def _float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 1e12:
        raise ScheduleError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


def _str(value: Any, name: str, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > 256:
        raise ScheduleError(f"{name}: expected a non-empty string of at most 256 characters, got {value!r}")
    return value
