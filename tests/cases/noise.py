"""Random tensor contents for the operator cases, cheap to draw under QEMU."""

from __future__ import annotations

import numpy as np
import torch


def unit_normal(*shape: int, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, 1) values of ``shape`` in ``dtype``, deterministic in ``generator``'s state.

    Drawn by numpy's ziggurat sampler, seeded from ``generator``, rather than
    by torch.randn: the distribution is the same, but randn's Box-Muller runs
    scalar log/sqrt/sin/cos per element, which QEMU emulates slowly (4.5M
    values, the size of the decode matrix's largest caches: 1.49 s against
    0.53 s at VLEN 256).
    """
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    values = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    # Copied into a fresh tensor: numpy gives empty arrays zero strides, which the operators refuse.
    return torch.empty(shape).copy_(torch.from_numpy(values)).to(dtype)
