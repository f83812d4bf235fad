"""SimpleNN: a model built from hologram_torch.nn layers, used like any PyTorch model
(CPU tensors here; add .to("hologram") to run it on the device)."""

import torch

import hologram_torch as hg


class SimpleNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = hg.nn.Linear(128, 64)
        self.relu1 = hg.nn.ReLU()
        self.fc2 = hg.nn.Linear(64, 32)
        self.relu2 = hg.nn.ReLU()
        self.fc3 = hg.nn.Linear(32, 10)

    def forward(self, x):
        x = self.fc1(x)
        x = self.relu1(x)
        x = self.fc2(x)
        x = self.relu2(x)
        x = self.fc3(x)
        return x


# Use like any PyTorch model
model = SimpleNN()
x = torch.randn(32, 128)
y = model(x)
print(f"output {tuple(y.shape)}, mean {y.mean().item():+.4f}")

# The same model on the hologram device
model.to("hologram")
y_device = model(x.to("hologram"))
assert torch.allclose(y_device.cpu(), y, atol=1e-5)
print(f"on {y_device.device}: matches the CPU run")
