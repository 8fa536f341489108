"""`HolderShards`: the data shards one data holder draws its microbatches from, and the ledger of every draw.

A holder draws an iteration's microbatches round-robin over its shards before it runs them; the draws are
`pending` in its `DataLedger` until the iteration commits. An iteration that is abandoned (a peer died, a newer
schedule restarts it) rewinds every shard to where it stood before the draw and requeues the draws, so the same
samples are drawn again, by this holder or, when a shard has moved, by the holder that takes it over at the
position the scheduler committed last. Nothing here touches the network: the peer feeds it the schedule's
assignment and reports `positions()` with each iteration. A rewind seeks each shard back to the chunk it stood in
(`Shard.load_state_dict` with the resume fields), so it costs one chunk's tokenizing, not a pass's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from peers.data import Corpus, Shard
from peers.data_ledger import DataLedger


class HolderShards:
    """The shards a holder draws from (shard index -> `Shard`), their rewind points and its ledger."""

    def __init__(self, corpus: Corpus, ledger: DataLedger) -> None:
        self.corpus, self.ledger = corpus, ledger
        self.shards: dict[int, Shard] = {}
        self._snapshot: dict[int, dict[str, int]] = {}

    def use_own_data(self) -> None:
        """A holder with its own documents draws from all of them, whatever the schedule assigns."""
        self.shards = self.shards or {0: self.corpus.shard(0, 1)}

    def assign(self, indices: Sequence[int], total: int, positions: Mapping[str, Any], *,
               reload: bool = False) -> None:
        """Draw from shards `indices` of the run's `total` from now on. A shard kept is kept as it stands; a shard
        taken over starts at its committed position in `positions` (shard index as a string -> state), if any.
        With `reload` (this holder was out of the run: taken for gone, then placed again), a shard it kept starts
        at its position in `positions` too: another holder may have carried it meanwhile."""
        shards = {}
        for k in map(int, indices):
            shard = self.shards.get(k) or self.corpus.shard(k, total)
            if (reload or k not in self.shards) and positions.get(str(k)) is not None:
                shard.load_state_dict(positions[str(k)])
            shards[k] = shard
        for k, shard in self.shards.items():
            if k not in shards:
                shard.close()  # handed over: stop tokenizing ahead for it
        self.shards = shards

    def draw(self, microbatches: Sequence[int], *, iteration: int, epoch: int) -> dict[int, torch.Tensor]:
        """One batch per microbatch (in the order given), round-robin over the shards, each draw ledgered."""
        self._snapshot = {k: s.state_dict() for k, s in self.shards.items()}
        keys = sorted(self.shards)
        batches = {}
        for j, microbatch in enumerate(microbatches):
            k = keys[j % len(keys)]
            batches[microbatch] = self.shards[k].next_batch()
            self.ledger.draw(iteration=iteration, epoch=epoch, shard=k, data_epoch=self.shards[k].epoch,
                             microbatch=microbatch, windows=self.shards[k].last_indices)
        return batches

    def commit(self, iteration: int) -> None:
        """The iteration's gradients were applied: its draws are processed."""
        self.ledger.commit(iteration)
        self._snapshot = {}

    def retried(self, iteration: int, microbatch: int, attempt: int) -> None:
        """A microbatch of the iteration ran again after a peer on its path died (same samples, no new draw)."""
        self.ledger.retry(iteration, microbatch, attempt)

    def rewind(self, iteration: int) -> None:
        """The iteration was abandoned: requeue its draws and put every shard back where it stood before them."""
        if not self._snapshot:
            return
        self.ledger.requeue(iteration)
        for k, state in self._snapshot.items():
            if k in self.shards:
                self.shards[k].load_state_dict(state)
        self._snapshot = {}

    def positions(self) -> dict[str, dict[str, int]]:
        """Each shard's position (shard index as a string -> state), for the scheduler to hand a shard over."""
        return {str(k): s.state_dict() for k, s in self.shards.items()}

    def first(self) -> Shard | None:
        """The shard a checkpoint records the position of."""
        return next(iter(self.shards.values()), None)
