"""``hologram_torch.nn``: drop-in modules for their ``torch.nn`` namesakes whose forward
runs :mod:`hologram_torch.functional` (Hologram kernels, forward and backward).

Each module subclasses its ``torch.nn`` counterpart, so the constructor arguments, the
parameter initialization and the ``state_dict`` keys are PyTorch's: a checkpoint of a
``torch.nn.Linear`` loads into a ``hologram_torch.nn.Linear`` and back. They work on CPU
tensors and on hologram tensors, inside any ``torch.nn.Module``. No module creates an
executor: kernels are compiled once per signature and shared.
"""

from __future__ import annotations

import torch

from hologram_torch import functional as F

__all__ = ["GELU", "Linear", "MSELoss", "ReLU", "Sigmoid", "Softmax", "Tanh"]


class Linear(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ReLU(torch.nn.ReLU):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x, inplace=self.inplace)


class Sigmoid(torch.nn.Sigmoid):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.sigmoid(x)


class Tanh(torch.nn.Tanh):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.tanh(x)


class GELU(torch.nn.GELU):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate=self.approximate)


class Softmax(torch.nn.Softmax):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(x, dim=self.dim)


class MSELoss(torch.nn.MSELoss):
    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(input, target, reduction=self.reduction)
