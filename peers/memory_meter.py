"""`LiveTensorMemory`: the bytes of tensor storage alive while it is active, and their peak, on any device.

A dispatch mode sees every tensor an operator creates; each new storage is counted when it appears and
uncounted when it is freed (a finalizer on the storage, which torch keeps alive exactly as long as the C++
storage: autograd's saved tensors included). So the figures are real allocations (the sizes the allocator is
asked for), not an estimate from shapes. Tensors created before the mode started are not counted.

On CUDA, `torch.cuda.max_memory_allocated` says the same from the allocator itself; benchmarks use that there.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorMemory(TorchDispatchMode):
    """Counts live tensor storage bytes created inside `with LiveTensorMemory() as m:`.

    `m.live` is the bytes alive now, `m.peak` the most alive at once since the start or `reset_peak()`.
    Slows every operator by a Python call: measure time without it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._counted: set[int] = set()

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # views and in-place results share an input's storage: that memory is not new (and may predate the mode)
        inputs = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                if id(storage) not in inputs:
                    self._count(storage)
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)  # one Python object per live storage (torch preserves it), so views share the key
        if key in self._counted or storage.nbytes() == 0:
            return
        self._counted.add(key)
        nbytes = storage.nbytes()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, key, nbytes)

    def _freed(self, key: int, nbytes: int) -> None:
        if key in self._counted:
            self._counted.discard(key)
            self.live -= nbytes
