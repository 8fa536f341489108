"""What the peers of one stage do together: average their gradients, and equip a newcomer.

- allgather.py: visit-weighted gradient averaging of a stage group over the transport, robust to a faulty member
  (the default)
- hivemind_averager.py: StageAverager, per-stage DecentralizedAverager rounds weighted by microbatches processed
  (not Byzantine-robust)
- lineage.py: which rounds each copy of a stage stepped with, so that copies a mid-round death split are found
- mending.py: the strays of a split group take the other members' state
- state_transfer.py: a stage's weights and optimizer state handed to a joining or moving peer, taken by a joiner once
  two veterans agree on it
"""
