"""A training loop: hologram_torch.nn layers, MSELoss and Adam, on the hologram device,
with the same run on the CPU alongside to show the losses agree."""

import torch

import hologram_torch as hg


def train(device: str, steps: int = 10) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        hg.nn.Linear(128, 64),
        hg.nn.ReLU(),
        hg.nn.Linear(64, 10),
    ).to(device)
    inputs = torch.randn(64, 128).to(device)
    targets = torch.randn(64, 10).to(device)

    # Train like any PyTorch model
    optimizer = torch.optim.Adam(model.parameters())
    criterion = hg.nn.MSELoss()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        pred = model(inputs)
        loss = criterion(pred, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


device_losses = train("hologram")
cpu_losses = train("cpu")
for step, (d, c) in enumerate(zip(device_losses, cpu_losses)):
    print(f"step {step}: hologram {d:.6f}  cpu {c:.6f}")
assert all(abs(d - c) <= 1e-4 * abs(c) for d, c in zip(device_losses, cpu_losses))
assert device_losses[-1] < device_losses[0]
