"""aten kernels of the hologram device, by family. Importing this package registers them;
every op without a kernel here goes through :mod:`hologram_torch.fallback`."""

from hologram_torch.aten import tensor  # noqa: F401  (registers kernels)
from hologram_torch.aten import reduction, nn  # noqa: F401
from hologram_torch.aten import linalg, shape  # noqa: F401
from hologram_torch.aten.registry import NATIVE

__all__ = ["NATIVE"]
