"""Data-parallel training on the hologram device: DistributedDataParallel over the
``hologram`` torch.distributed backend.

    torchrun --nproc-per-node 2 examples/ddp_train.py              # one machine
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 \\
        --master-addr 10.0.0.1 --master-port 29500 examples/ddp_train.py   # machine 0 of 2

Each process trains the same MLP on its own share of every batch; DDP averages the
gradients across processes (gloo, over TCP), so all copies of the model stay identical.
Run without torchrun, it trains as a group of one. docs/distributed.md explains the rest.
"""

import argparse
import datetime
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hologram_torch  # noqa: F401 (registers the device and the "hologram" backend)


def init_process_group() -> None:
    """torchrun's env:// rendezvous when launched by torchrun; else a group of one."""
    timeout = datetime.timedelta(seconds=60)
    # torch 2.13 does not infer the backend for a custom device: name it
    backend = "cpu:gloo,hologram:hologram"
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    args = parser.parse_args()

    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world}: backend {dist.get_backend()}", flush=True)

    torch.manual_seed(0)  # the same data on every rank; each takes its own share
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 1))
    model = DistributedDataParallel(model.to("hologram"))  # rank 0's weights everywhere
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    true_weights = torch.randn(32, 1)

    share = args.batch // world
    first_loss = last_loss = None
    for step in range(args.steps):
        x = torch.randn(args.batch, 32)
        y = x @ true_weights
        mine = slice(rank * share, (rank + 1) * share)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[mine].to("hologram")),
                                            y[mine].to("hologram"))
        loss.backward()  # DDP all-reduces the gradients here, bucket by bucket
        optimizer.step()
        # the mean loss over all ranks, for the log
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        first_loss = mean.item() if first_loss is None else first_loss
        last_loss = mean.item()
        if rank == 0 and step % 5 == 0:
            print(f"step {step}: loss {last_loss:.4f}", flush=True)

    # every rank holds the same parameters: compare with rank 0's
    for p in model.parameters():
        theirs = p.detach().clone()
        dist.broadcast(theirs, src=0)
        assert torch.equal(theirs.cpu(), p.detach().cpu())
    print(f"rank {rank}/{world}: parameters identical on every rank; loss "
          f"{first_loss:.4f} -> {last_loss:.4f}", flush=True)
    assert last_loss < first_loss
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
