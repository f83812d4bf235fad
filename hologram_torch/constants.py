"""Names the modules of the torch device share, in a module of their own so that none of
them has to import another for them (device.py and memory.py used to import each other).
``torch.device(NAME)`` itself exists only once :func:`hologram_torch.device.register` has
renamed PyTorch's PrivateUse1 backend, so it is made where it is used, after that."""

from __future__ import annotations

import torch

#: The device's name: ``torch.device("hologram")``.
NAME = "hologram"
#: The dispatch key set that sends an op to PyTorch's CPU kernels (the fallback, aliasing
#: views of device memory as CPU tensors).
CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
