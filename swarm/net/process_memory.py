"""What a node's process does so that it does not carry memory it does not use (issue #19: 40 peers on one host).

`share_by_descriptor`: hivemind passes each DHT call's future to its DHT process with a few bytes of torch shared
memory, and sets torch's "file_system" sharing strategy for it, which starts a `torch_shm_manager` process per node
(~60 MiB of PSS each: it maps libtorch). Shared through file descriptors instead, the same bytes need no manager.
"""

from __future__ import annotations

import torch.multiprocessing

SHARING_STRATEGY = "file_descriptor"


def share_by_descriptor() -> None:
    """Share torch tensors between this process and its children through file descriptors (no `torch_shm_manager`).

    Call it before the node's DHT starts: what was already shared by file name keeps its manager."""
    torch.multiprocessing.set_sharing_strategy(SHARING_STRATEGY)
