"""``hologram_torch.nn``: drop-in modules for their ``torch.nn`` namesakes whose forward
runs :mod:`hologram_torch.functional` (Hologram kernels, forward and backward).

Each module subclasses its ``torch.nn`` counterpart, so the constructor arguments, the
parameter initialization and the ``state_dict`` keys are PyTorch's: a checkpoint of a
``torch.nn.Linear`` loads into a ``hologram_torch.nn.Linear`` and back. They work on CPU
tensors and on hologram tensors, inside any ``torch.nn.Module``. No module creates an
executor: kernels are compiled once per signature and shared.

They behave as their ``torch.nn`` counterparts on every input: the functional kernels
take floating-point operands of one dtype, one device and matching shapes; any other call
(integer inputs, broadcasting targets, mixed dtypes, shapes torch rejects, an implicit
softmax dimension) runs the ``torch.nn`` module's own forward, which computes what torch
computes or raises torch's error and warnings.
"""

from __future__ import annotations

import torch

from hologram_torch import functional as F
from hologram_torch.aten.runner import ISA

__all__ = ["GELU", "Linear", "MSELoss", "ReLU", "Sigmoid", "Softmax", "Tanh"]


def _served(*tensors: torch.Tensor | None) -> bool:
    """Do the functional kernels compute these operands as torch would: floating-point
    tensors of one native dtype on one device (None: an absent optional operand)?"""
    present = [t for t in tensors if t is not None]
    first = present[0]
    return (first.dtype.is_floating_point and first.dtype in ISA
            and all(t.dtype is first.dtype and t.device == first.device for t in present))


class Linear(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if _served(x, w, b) and x.dim() >= 1 and x.shape[-1] == w.shape[1]:
            return F.linear(x, w, b)
        return super().forward(x)  # torch's errors (shapes, dtypes, devices)


class ReLU(torch.nn.ReLU):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _served(x):
            return F.relu(x, inplace=self.inplace)
        return super().forward(x)  # integers stay integers, as in torch


class Sigmoid(torch.nn.Sigmoid):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.sigmoid(x) if _served(x) else super().forward(x)  # integers: floats


class Tanh(torch.nn.Tanh):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.tanh(x) if _served(x) else super().forward(x)  # integers: floats


class GELU(torch.nn.GELU):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _served(x) and self.approximate in ("none", "tanh"):
            return F.gelu(x, approximate=self.approximate)
        return super().forward(x)


class Softmax(torch.nn.Softmax):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # dim=None: torch picks a dimension and warns that the choice is deprecated
        if _served(x) and self.dim is not None and -max(x.dim(), 1) <= self.dim < max(
                x.dim(), 1):
            return F.softmax(x, dim=self.dim)
        return super().forward(x)


class MSELoss(torch.nn.MSELoss):
    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # another shape: torch warns and broadcasts (or raises)
        if _served(input, target) and input.shape == target.shape:
            return F.mse_loss(input, target, reduction=self.reduction)
        return super().forward(input, target)
