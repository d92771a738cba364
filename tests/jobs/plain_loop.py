"""A plain PyTorch training loop that reports each step through cubicml_lab.report.

An MLP regression on random data: ``--batch`` samples of ``--width`` features per step, for
``--steps`` steps (the lab stops it sooner once its figure is good enough). Run by hand it trains
and exits; under the lab it appends one line per step to the metrics file. Used by
tests/test_command.py (also under torchrun: each rank trains its own replica with DDP over gloo).
"""

import argparse
import os

import torch

from cubicml_lab import report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 1))
    if "WORLD_SIZE" in os.environ:  # under torchrun: data parallel over gloo
        torch.distributed.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, 1)
    print(f"label={args.label}", flush=True)
    for step in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        report.step(samples=args.batch, loss=float(loss))
    report.memory()


if __name__ == "__main__":
    main()
