#!/usr/bin/python3
"""Fashion-MNIST in plain PyTorch with zinfinity's NVMeOptimizer.

The training example of DeepSpeed's walk-through (seed 003, section 3: a model, a data loader, a
loop of forward, loss, backward and step, then the test accuracy), with the optimizer's fp32
master parameters and AdamW moments kept on NVMe by ``zinfinity.offload.NVMeOptimizer`` instead
of ``deepspeed.initialize``. The model is the MLP of ``configs/fashion-mnist.json`` (784 → 1024 →
1024 → 10, ReLU). The data are Debian's ``dataset-fashion-mnist`` (installed by
``scripts/install-deps.sh``)::

    PYTHONPATH=build/python /usr/bin/python3 examples/pytorch_fashion_mnist.py --epochs 1 \\
        --nvme-path /tmp

prints the loss every 100 steps and the test accuracy after each epoch.
"""

import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
from torch import nn

DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's training pixels


def load_idx(path):
    """An IDX file (gzip'd or not) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    body = 4 + 4 * ndim
    if len(data) - body != int(np.prod(dims)):
        raise ValueError(f"{path}: {len(data) - body} bytes of data for shape {dims}")
    return np.frombuffer(data, dtype=np.uint8, offset=body).reshape(dims)


def load_split(root, split):
    """Normalised images (N, 784) and labels (N,) of 'train' or 't10k'."""
    images = load_idx(os.path.join(root, f"{split}-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(root, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    return (x - MEAN) / STD, torch.from_numpy(labels.astype(np.int64))


def load_data(root=DATA, batch_size=128, seed=1234):
    train = torch.utils.data.TensorDataset(*load_split(root, "train"))
    test = torch.utils.data.TensorDataset(*load_split(root, "t10k"))
    g = torch.Generator().manual_seed(seed)
    return (torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True, generator=g),
            torch.utils.data.DataLoader(test, batch_size=1000))


class CustomModel(nn.Module):
    def __init__(self, hidden=1024):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


@torch.no_grad()
def accuracy(model, loader):
    model.eval()
    correct = total = 0
    for images, labels in loader:
        correct += (model(images).argmax(1) == labels).sum().item()
        total += labels.numel()
    model.train()
    return correct / total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many (0: all)")
    parser.add_argument("--nvme-path", default="/tmp",
                        help="directory for the swap file (default /tmp; removed at exit)")
    parser.add_argument("--sub-group-size", type=int, default=1 << 20)
    parser.add_argument("--data", default=DATA)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)

    from zinfinity.offload import NVMeOptimizer

    torch.manual_seed(args.seed)
    train_loader, test_loader = load_data(args.data, args.batch_size, args.seed)
    model = CustomModel()
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = NVMeOptimizer(model.parameters(), optimizer="adamw", nvme_path=args.nvme_path,
                              sub_group_size=args.sub_group_size, lr=args.lr,
                              weight_decay=args.weight_decay)
    print(f"{n_params} parameters; fp32 masters and AdamW moments on {args.nvme_path} "
          f"({optimizer.backend}, {len(optimizer.swap_files())} swap file)", flush=True)
    loss_fn = nn.CrossEntropyLoss()
    step, start = 0, time.time()
    with optimizer:
        for epoch in range(args.epochs):
            for images, labels in train_loader:
                loss = loss_fn(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
                if step % 100 == 0:
                    s = optimizer.last_step_stats[0]
                    print(f"epoch {epoch + 1} step {step}: loss {loss.item():.4f} "
                          f"({(time.time() - start) / step * 1e3:.1f} ms/step; optimizer "
                          f"{s['seconds'] * 1e3:.1f} ms, {(s['bytes_read'] + s['bytes_written']) / 2**20:.1f} "
                          f"MiB moved)", flush=True)
                if args.max_steps and step >= args.max_steps:
                    break
            print(f"epoch {epoch + 1}: test accuracy {100 * accuracy(model, test_loader):.2f}%",
                  flush=True)
            if args.max_steps and step >= args.max_steps:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
