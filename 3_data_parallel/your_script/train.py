"""An ordinary single-process PyTorch training script: a small CNN on MNIST, the kind PyTorch's own
examples contain (pytorch/examples `mnist/main.py`), written with no SageMaker and no workshop in mind
except where it reads its data and writes its model: the folders SageMaker names in `SM_CHANNEL_TRAIN`,
`SM_CHANNEL_TEST` and `SM_MODEL_DIR`, each with a local default.

    python train.py --epochs 2        # alone, one process, with the data in data/mnist/{train,test}

`your_script.ipynb` makes it data parallel by replacing `prepare()` (the one function that decides how
the model and the data meet), then runs it unchanged otherwise on simulated SageMaker hosts and on SageMaker.
"""

import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.fc1 = nn.Linear(32 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def load(folder):
    """A channel's digits: images scaled to [0, 1] and their labels."""
    data = np.load(os.path.join(folder, "mnist.npz"))
    images = torch.from_numpy(data["images"]).float().div(255).unsqueeze(1)
    return TensorDataset(images, torch.from_numpy(data["labels"]).long())


def prepare(model, train_set, batch_size):
    """How the model and the data meet: one process, the whole data set in shuffled batches."""
    return model, DataLoader(train_set, batch_size=batch_size, shuffle=True)


def main():
    parser = argparse.ArgumentParser(description="A small CNN on MNIST")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN", "data/mnist/train"))
    parser.add_argument("--test", default=os.environ.get("SM_CHANNEL_TEST", "data/mnist/test"))
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "model"))
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = Net()
    train_set, test_set = load(args.train), load(args.test)
    model, loader = prepare(net, train_set, args.batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(1, args.epochs + 1):
        model.train()
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: {len(loader)} batches of {args.batch_size}, last loss {loss.item():.4f}", flush=True)

    net.eval()
    with torch.no_grad():
        images, labels = test_set.tensors
        accuracy = (net(images).argmax(1) == labels).float().mean().item()
    print(f"test accuracy: {accuracy:.4f}", flush=True)
    os.makedirs(args.model_dir, exist_ok=True)
    torch.save(net.state_dict(), os.path.join(args.model_dir, "model.pt"))


if __name__ == "__main__":
    main()
