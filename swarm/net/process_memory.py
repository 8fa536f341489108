"""What a node's process does so that it does not carry memory it does not use (issue #19: 40 peers on one host).

`share_by_descriptor`: hivemind passes each DHT call's future to its DHT process with a few bytes of torch shared
memory, and sets torch's "file_system" sharing strategy for it, which starts a `torch_shm_manager` process per node
(~60 MiB of PSS each: it maps libtorch). Shared through file descriptors instead, the same bytes need no manager.

`return_large_buffers`: glibc's malloc serves a block over its mmap threshold with a mapping of its own, returned to
the system on free, but raises that threshold to the size of each such block freed (up to 32 MiB). From the first
16 MiB message freed on, every later one comes from a thread's arena, and what is freed there stays with the
process: a peer carrying 16 MiB messages (`swarm.message_bytes`) grew by ~260 MiB of buffers it no longer used,
spread over its sender, transport and consumer threads' arenas. A fixed threshold keeps large blocks mapped apart.

`freeze_before_fork`: hivemind's DHT is a process forked from the node's, sharing its memory until either writes a
page. Python's cyclic garbage collector writes to every object it examines, and its full collections examine them
all, so each one copies pages of the objects alive at the fork (imports: torch, hivemind, the peer's modules) in the
process that runs it. Frozen, those objects are left out of collections in both: ~30 MiB less PSS per peer (the DHT
process 137 -> 123 MiB, the peer 269 -> 254 MiB).
"""

from __future__ import annotations

import ctypes
import gc
import logging

import torch.multiprocessing

logger = logging.getLogger(__name__)

SHARING_STRATEGY = "file_descriptor"
MMAP_THRESHOLD = 4 << 20
"""Blocks of this many bytes and more are mapped apart and unmapped when freed (messages, padded tensors, receive
buffers); smaller ones (1 MiB stream chunks, headers) stay in malloc's arenas, reused without a system call."""
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h


def share_by_descriptor() -> None:
    """Share torch tensors between this process and its children through file descriptors (no `torch_shm_manager`).

    Call it before the node's DHT starts: what was already shared by file name keeps its manager."""
    torch.multiprocessing.set_sharing_strategy(SHARING_STRATEGY)


def return_large_buffers(threshold: int = MMAP_THRESHOLD) -> bool:
    """From now on this process returns each freed block of `threshold` bytes or more to the system at once.

    Returns whether the C library took the setting (False where it has no `mallopt`, as on macOS: nothing changes).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, threshold) == 1
    if not done:
        logger.debug("mallopt refused an mmap threshold of %d bytes", threshold)
    return done


def freeze_before_fork() -> None:
    """Collect the garbage, then leave every object alive now out of later collections (`gc.freeze`), in this
    process and in any it forks next, so that neither writes to the pages they share.

    Objects alive now that later become unreachable in a reference cycle are never freed: call it where what is
    alive is the process's lasting state (its imports, the node being started), as just before the DHT forks."""
    gc.collect()
    gc.freeze()
