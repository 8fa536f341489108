"""Named tensors as one flat float32 vector and back, in sorted-name order.

Every peer of a stage has the same parameter names and shapes, so the order of the names is the layout both ends
of a gradient exchange or a state transfer agree on without sending it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def flatten(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """One float32 vector of `tensors`, in sorted-name order."""
    return torch.cat([tensors[n].detach().reshape(-1).to(torch.float32) for n in sorted(tensors)])


def unflatten(flat: torch.Tensor, shapes: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]:
    """`flat` cut into tensors of `shapes` (name -> shape), in sorted-name order; views into `flat`.

    Raises ValueError unless `flat` is a vector holding exactly as many elements as `shapes` describe.
    """
    if flat.dim() != 1 or flat.numel() != sum(shape.numel() for shape in shapes.values()):
        raise ValueError(f"a flat vector of {flat.numel()} elements does not hold tensors of "
                         f"{sum(shape.numel() for shape in shapes.values())}")
    out, pos = {}, 0
    for name in sorted(shapes):
        n = shapes[name].numel()
        out[name] = flat[pos:pos + n].view(shapes[name])
        pos += n
    return out
