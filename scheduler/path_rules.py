"""The convergence constraints on one microbatch's path (METHOD.md), as pure functions.

A path is the sequence of non-zero stages a microbatch visits after leaving its data holder
(stage 0) and before returning to it. Skipped stages are identity, so only the order matters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from scheduler.constants import DEFAULT_MAX_JUMP, DEFAULT_MAX_SWAP_DISTANCE, DEFAULT_MAX_SWAPS


@dataclass(frozen=True)
class PathRules:
    """What a valid path looks like for a run with `num_stages` stages."""

    num_stages: int
    """S: stages of the model, stage 0 included."""
    stages_per_path: int
    """R: distinct stages a microbatch visits, stage 0 included (R = S is the full pipeline)."""
    max_swaps: int = DEFAULT_MAX_SWAPS
    """Hops below the frontier (the highest stage visited so far) allowed on one path."""
    max_swap_distance: int = DEFAULT_MAX_SWAP_DISTANCE
    """How far below the frontier a swapped hop may land."""
    max_jump: int = DEFAULT_MAX_JUMP
    """How far above the frontier one hop may go."""
    unserved: frozenset[int] = frozenset()
    """Non-zero stages no peer serves at the moment (all left): paths skip them until a peer takes one over."""

    def __post_init__(self) -> None:
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")
        if not 1 <= self.stages_per_path <= self.num_stages:
            raise ValueError(
                f"stages_per_path (R) must be in 1..num_stages={self.num_stages}, got {self.stages_per_path}"
            )
        if self.max_swaps < 0 or self.max_swap_distance < 0:
            raise ValueError("max_swaps and max_swap_distance must be >= 0")
        if self.max_jump < 1:
            raise ValueError(f"max_jump must be >= 1, got {self.max_jump}")
        if any(not 1 <= s < self.num_stages for s in self.unserved):
            raise ValueError(f"unserved stages must be non-zero stages of 1..{self.num_stages - 1}, got "
                             f"{sorted(self.unserved)}")
        if self.stages_per_path > self.num_stages - len(self.unserved):
            raise ValueError(f"stages_per_path (R) = {self.stages_per_path} cannot be met with stages "
                             f"{sorted(self.unserved)} unserved")

    @property
    def hops(self) -> int:
        """Non-zero stages on each path."""
        return self.stages_per_path - 1

    @property
    def skip_ratio(self) -> float:
        return 1.0 - self.stages_per_path / self.num_stages

    @classmethod
    def from_skip_ratio(cls, num_stages: int, skip: float, **kwargs: int) -> PathRules:
        """R = round((1 - skip) * S), at least 1: the paper's skip ratio k = 1 - R/S."""
        if not 0.0 <= skip < 1.0:
            raise ValueError(f"skip ratio must be in [0, 1), got {skip}")
        stages_per_path = max(1, min(num_stages, round((1.0 - skip) * num_stages)))
        return cls(num_stages=num_stages, stages_per_path=stages_per_path, **kwargs)


def never_trained_stages(stages: int, skip: float) -> list[int]:
    """The stages no valid path can visit with `skip` (R = round((1 - skip) * S) stages per path): a path makes
    R - 1 hops past stage 0, each at most `max_jump` stages above the highest so far, so it reaches no stage above
    (R - 1) * max_jump, and with R = 1 none at all. Peers placed there would receive nothing for the whole run."""
    rules = PathRules.from_skip_ratio(stages, skip)
    return list(range(rules.hops * rules.max_jump + 1, stages))


def rules_around(rules: PathRules, unserved: set[int] | frozenset[int]) -> tuple[PathRules, bool]:
    """`rules` for a swarm in which the non-zero stages `unserved` have no peer: paths skip them, and when that
    leaves too few stages (or no valid path) for R, R is lowered until paths exist. Returns the rules and
    whether R was relaxed (the caller says so: the skip ratio is then above what the run asked for)."""
    unserved = frozenset(unserved)
    r = min(rules.stages_per_path, rules.num_stages - len(unserved))
    while True:
        relaxed = dataclasses.replace(rules, stages_per_path=max(1, r), unserved=unserved)
        if r <= 1 or valid_stage_sequences(relaxed):
            return relaxed, relaxed.stages_per_path < rules.stages_per_path
        r -= 1


def path_violation(stages: tuple[int, ...] | list[int], rules: PathRules) -> str | None:
    """Why `stages` is not a valid path under `rules`, or None when it is.

    :returns: a message naming the hop (1-based, the first hop leaves the data holder) and the rule.
    """
    if len(stages) != rules.hops:
        return f"path has {len(stages)} non-zero stages, the rule is R-1 = {rules.hops}"
    seen: set[int] = set()
    frontier, swaps = 0, 0
    for hop, stage in enumerate(stages, start=1):
        if not 1 <= stage < rules.num_stages:
            return f"hop {hop}: stage {stage} is not a non-zero stage of 1..{rules.num_stages - 1}"
        if stage in rules.unserved:
            return f"hop {hop}: stage {stage} has no peer (unserved stages are skipped)"
        if stage in seen:
            return f"hop {hop}: stage {stage} visited twice (each stage at most once)"
        seen.add(stage)
        if stage > frontier:
            if stage - frontier > rules.max_jump:
                return f"hop {hop}: jump of {stage - frontier} stages exceeds max_jump={rules.max_jump}"
            frontier = stage
        else:
            swaps += 1
            if frontier - stage > rules.max_swap_distance:
                return (
                    f"hop {hop}: swap distance {frontier - stage} exceeds "
                    f"max_swap_distance={rules.max_swap_distance}"
                )
            if swaps > rules.max_swaps:
                return f"hop {hop}: swap number {swaps} exceeds max_swaps={rules.max_swaps}"
    return None


@lru_cache(maxsize=64)
def valid_stage_sequences(rules: PathRules, limit: int = 20_000) -> tuple[tuple[int, ...], ...]:
    """Every valid path under `rules`, in lexicographic order (in-order paths first per stage set).

    Depth-first with the rules as pruning, so the count stays small for the bounded reordering
    the method allows; `limit` guards pathological rule sets (then the first `limit` are kept).
    """
    out: list[tuple[int, ...]] = []
    nonzero = [s for s in range(1, rules.num_stages) if s not in rules.unserved]

    def extend(prefix: list[int], frontier: int, swaps: int) -> None:
        if len(out) >= limit:
            return
        if len(prefix) == rules.hops:
            out.append(tuple(prefix))
            return
        for stage in nonzero:
            if stage in prefix:
                continue
            if stage > frontier:
                if stage - frontier > rules.max_jump:
                    break
                prefix.append(stage)
                extend(prefix, stage, swaps)
                prefix.pop()
            elif swaps < rules.max_swaps and frontier - stage <= rules.max_swap_distance:
                prefix.append(stage)
                extend(prefix, frontier, swaps + 1)
                prefix.pop()

    extend([], 0, 0)
    return tuple(out)
