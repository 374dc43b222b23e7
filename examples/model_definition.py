"""The model and data of the DeepSpeed example (ds_train.py, ds_eval.py): an MLP over
Fashion-MNIST, read with torchvision's dataset class from Debian's dataset-fashion-mnist
(/usr/share/datasets/fashion-mnist, installed by scripts/install-deps.sh), which this module
unpacks once into ./data/FashionMNIST/raw, where torchvision looks for it."""

import gzip
import os
import shutil

import torch
from torch import nn
from torchvision import datasets, transforms

DEBIAN_DATA = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot"]
# Fashion-MNIST's training pixels: mean and standard deviation.
transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])


def prepare(root="./data", source=DEBIAN_DATA):
    """Unpacks the Debian package's files where torchvision's FashionMNIST reads them."""
    raw = os.path.join(root, "FashionMNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for split in ("train", "t10k"):
        for kind in ("images-idx3", "labels-idx1"):
            name = f"{split}-{kind}-ubyte"
            target = os.path.join(raw, name)
            if os.path.exists(target):
                continue
            src = os.path.join(source, name + ".gz")
            if not os.path.exists(src):
                raise FileNotFoundError(f"{src} not found: install dataset-fashion-mnist "
                                        "(scripts/install-deps.sh)")
            with gzip.open(src, "rb") as f, open(target + ".part", "wb") as out:
                shutil.copyfileobj(f, out)
            os.replace(target + ".part", target)
    return root


def load_data(batch_size=128, root="./data"):
    """Train and test loaders; the train loader's batch is train_batch_size / ranks."""
    prepare(root)
    train = datasets.FashionMNIST(root=root, train=True, transform=transform)
    test = datasets.FashionMNIST(root=root, train=False, transform=transform)
    return (torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True),
            torch.utils.data.DataLoader(test, batch_size=1000))


class CustomModel(nn.Module):
    def __init__(self, hidden=1024):
        super().__init__()
        self.flatten = nn.Flatten()
        self.net = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(self.flatten(x))
