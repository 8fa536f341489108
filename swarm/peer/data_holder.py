"""`DataHolder`: the part of a stage-0 peer that follows the schedule's data shards.

A holder draws its microbatches from the shards its epoch assigns it (its own shard, and any it took over from a
holder that died or stopped injecting), each taken-over shard starting at its position after the iteration before
the one this peer runs next: the scheduler's newest commit says where that is when it committed exactly that
iteration, the schedule's planned positions otherwise. A holder with its own documents (`--data`) draws from them
only. The shards and their ledger are `peers.holder_shards.HolderShards` (no network); this class adds the
schedule's rules.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

import torch

from peers.data import Corpus, DataConfig
from peers.data_ledger import DataLedger
from peers.holder_shards import HolderShards
from scheduler.schedule import Schedule

logger = logging.getLogger(__name__)


class DataHolder:
    """Data holder `peer_id`'s shards, as its schedules assign them.

    :param own_data: the peer brought its own documents: it draws from them, whatever the schedule assigns
    """

    def __init__(self, shards: HolderShards, peer_id: str, *, own_data: bool = False) -> None:
        self.shards, self.peer_id, self.own_data = shards, peer_id, own_data

    @classmethod
    def load(cls, data: DataConfig, vocab_size: int, peer_id: str, *, data_paths: Sequence[str] = (),
             ledger_path: str | None = None) -> DataHolder:
        """The run's corpus (its tokenizer must have the run's `vocab_size`), or this peer's own documents if it
        brought some, with a ledger of every draw at `ledger_path`."""
        corpus = Corpus.build(data)
        if corpus.vocab_size > vocab_size:  # fewer is fine: an imported model's vocabulary is often padded
            raise ValueError(f"tokenizer has {corpus.vocab_size} tokens, the run's model only {vocab_size}")
        if data_paths:
            corpus = corpus.with_documents(data_paths)
        return cls(HolderShards(corpus, DataLedger(ledger_path, holder=peer_id)), peer_id, own_data=bool(data_paths))

    def follow(self, schedule: Schedule, iteration: int, committed: tuple[int, dict[str, Any]], *,
               placed_again: bool = False) -> None:
        """Draw from the shards `schedule` assigns this holder from `iteration` on; `committed` is the scheduler's
        newest commit (its iteration, shard positions). A bad committed position is refused (logged) and the
        schedule's used. `placed_again`: this holder is placed after being out of the run (taken for gone while
        alive, say): the shards it still holds start where the commit (or the schedule) says, not where it left
        them, since others carried them meanwhile."""
        if self.own_data:
            self.shards.use_own_data()
            return
        specs = schedule.meta.get("shards", {}).get(self.peer_id)
        if specs is None:
            specs = [schedule.data_holders.index(self.peer_id)]
        total = int(schedule.meta.get("num_shards", len(schedule.data_holders)))
        planned = schedule.meta.get("shard_positions", {})
        commit_iteration, positions = committed
        starts = {**planned, **positions} if commit_iteration == iteration - 1 else planned
        try:
            self.shards.assign(specs, total, starts, reload=placed_again)
        except ValueError as e:
            logger.error("the scheduler's commit of iteration %d gave a bad data position (%s): using the "
                         "schedule's", commit_iteration, e)
            self.shards.assign(specs, total, planned, reload=placed_again)

    def draw(self, schedule: Schedule, iteration: int) -> dict[int, torch.Tensor]:
        """This holder's microbatches for `iteration`, in the order it injects them."""
        own = sorted((r for r in schedule.routes if r.origin == self.peer_id),
                     key=lambda r: (r.inject_after, r.microbatch))
        return self.shards.draw([r.microbatch for r in own], iteration=iteration, epoch=schedule.epoch)

    def abandon(self, iteration: int, finished_after: int, left_out: Collection[str]) -> None:
        """`iteration` is abandoned: its draws go back and the shards rewind (a no-op unless it drew), unless the run
        ended after `finished_after` > `iteration` iterations (its 'finished' came before this commit): then it was
        committed, and its draws are settled as `settle` would."""
        if finished_after > iteration:
            self.settle(iteration, left_out)
        else:
            self.shards.rewind(iteration)

    def settle(self, iteration: int, left_out: Collection[str], retried: Sequence[tuple[int, int]] = ()) -> bool:
        """The scheduler committed `iteration`: its draws are processed (`retried`: (microbatch, attempt) that ran
        again within it), unless the commit left this holder out (it was taken for gone while it ran, or was late
        against the others, and its microbatches were not counted): then they go back, and the shard is drawn on
        from where it stood before them, by whichever holder carries it next. True if this holder's draws were
        counted."""
        if self.peer_id in left_out:
            logger.warning("iteration %d committed without this holder's microbatches (it was taken for gone, or "
                           "was late against the other holders): its draws go back", iteration)
            self.shards.rewind(iteration)
            return False
        for microbatch, attempt in retried:
            self.shards.retried(iteration, microbatch, attempt)
        self.shards.commit(iteration)
        return True
