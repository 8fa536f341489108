"""Stage-group averaging by parts: a reduce-scatter with two owners per part, then an all-gather of the parts' means.

The all-gather (`swarm.stage_group.allgather`) sends every member's whole gradient to every other member: n - 1
gradients out per member and round, so a stage group's averaging grows with the square of its size (at 20 peers,
SkipPipe's stage 0 holds all 10 data holders, and its all-gather took half of each iteration). Here, for groups of
`MIN_MEMBERS` or more, the flat gradient is cut into as many parts as the group has members, and part k is combined
by two owners, the k-th and the (k+1)-th member in peer-id order (each member owns two parts):

1. PIECE: every member sends its piece of each part to the part's owners;
2. PART_MEAN: each owner combines its part's pieces exactly as the all-gather combines whole gradients (`stage_mean`:
   weights bounded by the schedule, the check against the stage's history, CenteredClip), and sends the result,
   its visits and a digest of its inputs (who contributed with what weight) to every other member;
3. BALLOT: a member takes a part only when both owners' copies came and agree bit for bit; it tells everyone which
   parts it could not take;
4. FALLBACK: the parts anybody could not take (the union of the ballots) are all-gathered piece by piece and combined
   by every member itself, as in the all-gather. A fallback piece received counts as a ballot for its part.

A member sends 4 (n - 1) / n gradients a round (plus the fallback's parts), not n - 1: 2.25x less at five members,
3.6x at ten. One owner alone cannot bias a part: its copy would disagree with its co-owner's, and the part goes to
the fallback, where nobody's combination is trusted. A faulty member can at worst send every part to the fallback
(the all-gather's cost), or tell members different things (as in the all-gather: their copies then differ, and the
lineages find and mend that at the next round). An owner that dies before sending its means costs its two parts a
fallback; a member that dies mid-round, in any step, leaves the survivors with the same parts except where it
reached some of them and not others, the all-gather's case.

Every member installs the same mean when it heard the same messages: parts taken are the owners' (identical) bits,
and fallback parts are combined in peer-id order from the same pieces. The lineage chains over each part's digest.

Two costs against the all-gather. CenteredClip runs per part, so an honest member whose part lies far from the
others' (the embedding rows of the tokens only it saw) can be clipped where the whole-vector clip would not have
clipped it: the honest group's mean is then not exactly the weighted mean (a 10-peer check clipped in 4 rounds of
6). And a round takes three steps and ~4x the messages: it pays where bytes dominate (slow links, large stages);
where each message's latency does (20 peers on 2 cores), it was no faster (BENCHMARKS.md, "Stage averaging by
parts"). Hence not the default. Computing the clip from the parts' Gram matrices (the whole-vector distances are
their sums) would remove the first cost; not built.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

import torch

from peers.averaging import Aggregation, history_norm, stage_mean, visit_bounds
from peers.worker import StageWorker
from swarm.events import event
from swarm.lateness import overdue
from swarm.net.delivery import Inbound, Send
from swarm.stage_group.allgather import (
    WIRE_DTYPES,
    GroupRound,
    average_stage_group,
    flatten,
    unflatten,
)
from swarm.stage_group.lineage import next_lineage
from swarm.wire import AverageStep, Direction, HopHeader

logger = logging.getLogger(__name__)

MIN_MEMBERS = 5
"""Smallest group averaged by parts: below it, the all-gather sends no more (at four members both send 3 gradients
a member) and takes one step, not three."""

Contribution = tuple[torch.Tensor, int]
"""A member's piece of a part and the visits it claimed."""


@dataclass(frozen=True)
class PartMean:
    """An owner's combination of one part: the mean, its visits, and a digest of who contributed with what weight."""

    mean: torch.Tensor
    visits: int
    digest: bytes

    def agrees(self, other: PartMean) -> bool:
        return self.visits == other.visits and self.digest == other.digest and torch.equal(self.mean, other.mean)


def part_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of each of `parts` near-equal parts of a vector of `numel` elements (the last may be shorter)."""
    per = math.ceil(numel / parts)
    return [(min(k * per, numel), min((k + 1) * per, numel)) for k in range(parts)]


def owners(members: list[str], part: int) -> tuple[str, str]:
    """The two members that combine `part` (members in peer-id order)."""
    return members[part], members[(part + 1) % len(members)]


def average_by_parts(*, me: str, worker: StageWorker, group: list[str], run_id: str, iteration: int, epoch: int,
                     send: Send, receive: Callable[[float], list[Inbound]], deadline: float,
                     scheduled: Mapping[str, int], aggregation: Aggregation = "centered_clip",
                     left_out: Collection[str] = (), alive: Callable[[str], bool] = lambda peer: True,
                     hold: Callable[[Inbound], None] | None = None,
                     faulty: Callable[[str, str], None] | None = None, lineage: bytes = b"",
                     wire_dtype: str = "float32", late: Callable[[str, float], None] | None = None,
                     tell: Send | None = None) -> GroupRound:
    """Install the stage group's robust visit-weighted mean gradient on `worker`, averaged by parts (see the module)
    in groups of `MIN_MEMBERS` or more, by the all-gather in smaller ones. Parameters as `average_stage_group`'s;
    `deadline` bounds each step's wait. A member the commit left out (a holder late against the others) takes no
    part: it steps on its own gradient, and the lineages find its copy apart and mend it at the next round it takes
    part in (the all-gather instead sends it the others' gradients, by `tell`)."""
    if me in left_out:
        return average_stage_group(me=me, worker=worker, group=[me], run_id=run_id, iteration=iteration, epoch=epoch,
                                   send=send, receive=receive, deadline=deadline, scheduled=scheduled,
                                   aggregation=aggregation, lineage=lineage, wire_dtype=wire_dtype)
    members = sorted(p for p in group if p not in left_out)
    numel = sum(p.numel() for p in worker.module.parameters())
    if len(members) < MIN_MEMBERS or numel < len(members):
        return average_stage_group(me=me, worker=worker, group=group, run_id=run_id, iteration=iteration,
                                   epoch=epoch, send=send, receive=receive, deadline=deadline, scheduled=scheduled,
                                   aggregation=aggregation, left_out=left_out, alive=alive, hold=hold, faulty=faulty,
                                   lineage=lineage, wire_dtype=wire_dtype, late=late, tell=tell)
    return PartsRound(me=me, worker=worker, group=group, members=members, run_id=run_id, iteration=iteration,
                      epoch=epoch, send=send, receive=receive, deadline=deadline, scheduled=scheduled,
                      aggregation=aggregation, alive=alive, hold=hold, faulty=faulty, lineage=lineage,
                      wire_dtype=wire_dtype, late=late).run()


class PartsRound:
    """One member's round of averaging by parts: what it received so far, by step, and what it sends next."""

    def __init__(self, *, me: str, worker: StageWorker, group: list[str], members: list[str], run_id: str,
                 iteration: int, epoch: int, send: Send, receive: Callable[[float], list[Inbound]], deadline: float,
                 scheduled: Mapping[str, int], aggregation: Aggregation, alive: Callable[[str], bool],
                 hold: Callable[[Inbound], None] | None, faulty: Callable[[str, str], None] | None, lineage: bytes,
                 wire_dtype: str, late: Callable[[str, float], None] | None = None) -> None:
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be one of {', '.join(WIRE_DTYPES)}, got {wire_dtype!r}")
        self.me, self.worker, self.group, self.members, self.run_id = me, worker, group, members, run_id
        self.iteration, self.epoch, self.deadline, self.scheduled = iteration, epoch, deadline, scheduled
        self._send, self._receive, self.alive, self.hold, self.faulty = send, receive, alive, hold, faulty
        self.aggregation, self.late = aggregation, late
        self.began = time.monotonic()
        self.first_heard: dict[str, float] = {}
        """Each member's first message of the round, in seconds into it: one never heard from is late against the
        others as in the all-gather (`swarm.lateness`)."""
        self.told: set[str] = set()
        self.lineage, self.dtype = lineage, WIRE_DTYPES[wire_dtype]
        self.others = [p for p in members if p != me]
        self.sums = worker.gradient_sums()
        self.flat = flatten(self.sums).to(self.dtype)  # what goes on the wire, and what this member combines
        self.bounds = part_bounds(self.flat.numel(), len(members))
        self.owned = [k for k in range(len(members)) if me in owners(members, k)]
        self.reference = history_norm(worker)
        self.pieces: dict[int, dict[str, Contribution]] = {k: {me: (self.piece(k), worker.visits)} for k in self.owned}
        self.lineages: dict[str, bytes] = {me: lineage}
        self.means: dict[int, dict[str, PartMean]] = {k: {} for k in range(len(members))}
        self.ballots: dict[str, set[int]] = {}
        self.fallback: dict[int, dict[str, Contribution]] = {}
        self.shared: set[int] = set()
        """Parts whose fallback piece this member sent."""
        self.ballots_closed = False
        """Whether this member has sent its fallback pieces (a later fallback piece makes it send its own too)."""

    # ---- the round ---------------------------------------------------------------------------------------------
    def run(self) -> GroupRound:
        for k in range(len(self.members)):
            for owner in owners(self.members, k):
                if owner != self.me:
                    self.send(owner, AverageStep.PIECE, k, self.piece(k), self.worker.visits, self.lineage)
        self.wait(lambda: all(self.me in self.means[k] for k in self.owned))
        for k in self.owned:
            self.combine_owned(k)  # with what came by the deadline
        self.wait(lambda: not self.awaiting_means())
        refused = [k for k in range(len(self.members)) if not self.taken(k)]
        ballot = torch.zeros(len(self.members), dtype=torch.uint8)
        ballot[refused] = 1
        for peer in self.others:
            self.send(peer, AverageStep.BALLOT, 0, ballot, 0, b"")
        self.wait(lambda: not [p for p in self.others if p not in self.ballots and self.alive(p)])
        self.ballots_closed = True
        self.share(self.fallback_parts(refused))
        self.wait(lambda: not self.awaiting_fallback())
        return self.install()

    def wait(self, done: Callable[[], bool]) -> None:
        """Take messages until `done()` or the step's deadline; owned parts are combined as soon as they can be."""
        end = time.monotonic() + self.deadline
        while True:
            self.combine_ready()
            self.tell_late()
            if done() or time.monotonic() >= end:
                return
            for m in self._receive(min(0.2, max(0.0, end - time.monotonic()))):
                self.take(m)

    def combine_ready(self) -> None:
        """Combine each owned part whose pieces are all in, or whose missing members are no longer waited for."""
        for k in self.owned:
            if self.me not in self.means[k] and not self.awaiting_part(k):
                self.combine_owned(k)

    def tell_late(self) -> None:
        """Tell `late` of the members never heard from once half of the others were, past their median."""
        heard = list(self.first_heard.values())
        awaited = max(0, len(self.others) - len(heard))
        behind = overdue(heard, awaited, time.monotonic() - self.began) if self.late else None
        if behind is not None:
            for p in self.others:
                if p not in self.first_heard and p not in self.told:
                    self.told.add(p)
                    self.late(p, behind)

    # ---- what is still awaited -----------------------------------------------------------------------------------
    def awaiting_part(self, k: int) -> list[str]:
        return [p for p in self.others if p not in self.pieces[k] and self.alive(p)]

    def awaiting_means(self) -> bool:
        return any(o not in self.means[k] and o != self.me and self.alive(o)
                   for k in range(len(self.members)) for o in owners(self.members, k))

    def awaiting_fallback(self) -> bool:
        return any(p not in self.fallback.get(k, {}) and self.alive(p) for k in self.shared for p in self.others)

    # ---- steps -----------------------------------------------------------------------------------------------------
    def piece(self, k: int) -> torch.Tensor:
        start, end = self.bounds[k]
        return self.flat[start:end]

    def combine(self, k: int, contributions: dict[str, Contribution]) -> PartMean:
        """`contributions` to part `k` combined as the all-gather combines whole gradients, in peer-id order."""
        order = sorted(contributions)
        bounds = visit_bounds(self.scheduled, self.group, order)
        result = stage_mean([contributions[p][0].float() for p in order], [contributions[p][1] for p in order],
                            bounds=[bounds[p] for p in order], reference=self.reference,
                            aggregation=self.aggregation)
        for i, why in sorted(result.refused.items()):
            self.refuse(order[i], f"part {k}: {why}", proof=why.startswith("refused"))
        digest = next_lineage(b"", self.iteration, {p: contributions[p][1] for p in order})
        return PartMean(result.mean, result.visits, digest)

    def combine_owned(self, k: int) -> None:
        if self.me in self.means[k]:
            return
        missing = self.awaiting_part(k) + [p for p in self.others if p not in self.pieces[k] and not self.alive(p)]
        if missing:
            logger.warning("stage %d averaging of iteration %d: part %d combined without %s", self.worker.stage,
                           self.iteration, k, sorted(missing))
        mean = self.combine(k, self.pieces[k])
        mean = self.means[k][self.me] = replace(mean, mean=mean.mean.to(self.dtype))  # as the others receive it
        for peer in self.others:
            self.send(peer, AverageStep.PART_MEAN, k, mean.mean, mean.visits, mean.digest)

    def taken(self, k: int) -> bool:
        """Whether both owners' means of part `k` came and agree."""
        copies = [self.means[k].get(o) for o in owners(self.members, k)]
        if copies[0] is None or copies[1] is None:
            return False
        if copies[0].agrees(copies[1]):
            return True
        logger.warning("stage %d averaging of iteration %d: the owners of part %d, %s, disagree on its mean",
                       self.worker.stage, self.iteration, k, " and ".join(owners(self.members, k)),
                       extra=event("part_disputed", stage=self.worker.stage, iteration=self.iteration, part=k,
                                   owners=list(owners(self.members, k))))
        return False

    def fallback_parts(self, refused: list[int]) -> set[int]:
        """The parts anybody could not take: this member's, its ballots', and those whose fallback pieces came."""
        parts = set(refused) | set(self.fallback)
        for ballot in self.ballots.values():
            parts |= ballot
        return parts

    def share(self, parts: set[int]) -> None:
        """Send this member's piece of each of `parts` to every other member (once per part)."""
        for k in sorted(parts - self.shared):
            self.shared.add(k)
            self.fallback.setdefault(k, {})[self.me] = (self.piece(k), self.worker.visits)
            for peer in self.others:
                self.send(peer, AverageStep.FALLBACK, k, self.piece(k), self.worker.visits, b"")

    def install(self) -> GroupRound:
        means: list[PartMean] = []
        for k in range(len(self.members)):
            if k in self.shared:
                means.append(self.combine(k, self.fallback[k]))
            else:
                means.append(self.means[k][owners(self.members, k)[0]])
        if self.shared:
            logger.info("stage %d averaging of iteration %d: parts %s combined by every member", self.worker.stage,
                        self.iteration, sorted(self.shared))
        visits = max(m.visits for m in means)
        mean = torch.cat([m.mean.float() for m in means])
        self.worker.set_mean_gradients(unflatten(mean, self.sums), visits)
        heard = {p for k in self.owned for p in self.pieces[k]}
        contributors = {f"part {k} {m.digest.hex()}": 1 for k, m in enumerate(means)}
        return GroupRound(visits, len(heard), {p: self.lineages[p] for p in sorted(self.lineages)}, contributors)

    # ---- messages --------------------------------------------------------------------------------------------------
    def send(self, peer: str, step: AverageStep, part: int, tensor: torch.Tensor, weight: int, lineage: bytes) -> None:
        header = HopHeader(run=self.run_id, iteration=self.iteration, microbatch=part, route=(self.me, peer), hop=1,
                           direction=Direction.AVERAGE, epoch=self.epoch, dtype="", shape=(),
                           stages=(self.worker.stage, self.worker.stage), weight=weight, lineage=lineage,
                           average_step=step)
        self._send(peer, header, tensor)

    def refuse(self, sender: str, why: str, proof: bool = False) -> None:
        logger.warning("stage %d averaging of iteration %d, from %s: %s", self.worker.stage, self.iteration, sender,
                       why, extra=event("gradient_refused", stage=self.worker.stage, iteration=self.iteration,
                                        sender=sender, why=why))
        if proof and self.faulty is not None:
            self.faulty(sender, why)

    def take(self, m: Inbound) -> None:
        """File one message of the round, or refuse it (logged; a malformed tensor is proof of a fault)."""
        h, t = m.header, m.tensor
        if h.epoch != self.epoch:
            if h.epoch > self.epoch and self.hold is not None:
                self.hold(m)
            else:
                logger.warning("dropped averaging message from %s: schedule epoch %d, this round is epoch %d",
                               m.sender, h.epoch, self.epoch)
            return
        if m.sender not in self.others or h.route != (m.sender, self.me):
            return self.refuse(m.sender, f"refused: not a member of stage {self.worker.stage}'s group")
        if h.stages and h.stages[0] != self.worker.stage:
            return self.refuse(m.sender, f"refused: stage {h.stages[0]}, this group is stage {self.worker.stage}")
        self.first_heard.setdefault(m.sender, time.monotonic() - self.began)
        step, k, n = h.average_step, h.microbatch, len(self.members)
        if step == AverageStep.BALLOT:
            if t.shape != (n,) or t.dtype != torch.uint8 or bool((t > 1).any()):
                return self.refuse(m.sender, f"refused: a ballot of {tuple(t.shape)} {t.dtype}, expected {n} "
                                   "uint8 flags", proof=True)
            if m.sender not in self.ballots:
                self.ballots[m.sender] = {int(i) for i in torch.nonzero(t).flatten()}
            return None
        if step == AverageStep.WHOLE or k >= n:  # no proof: a member that saw another group would send it too
            return self.refuse(m.sender, f"refused: {step.name.lower()} message of part {k}: this group averages "
                               f"by {n} parts")
        size = self.bounds[k][1] - self.bounds[k][0]
        if t.shape != (size,) or t.dtype != self.dtype or not torch.isfinite(t).all():
            return self.refuse(m.sender, f"refused: part {k}: {tuple(t.shape)} {t.dtype}, expected finite "
                               f"({size},) {self.dtype}", proof=True)
        if step == AverageStep.PIECE:
            if k not in self.owned:
                return self.refuse(m.sender, f"refused: a piece of part {k}, which this member does not own")
            self.lineages.setdefault(m.sender, h.lineage)
            if m.sender not in self.pieces[k] and self.me not in self.means[k]:
                self.pieces[k][m.sender] = (t, h.weight)
        elif step == AverageStep.PART_MEAN:
            if m.sender not in owners(self.members, k):
                return self.refuse(m.sender, f"refused: a mean of part {k}, which it does not own")
            self.means[k].setdefault(m.sender, PartMean(t, h.weight, h.lineage))
        else:  # FALLBACK: also a ballot for its part
            self.fallback.setdefault(k, {}).setdefault(m.sender, (t, h.weight))
            if self.ballots_closed:
                self.share({k})
        return None
