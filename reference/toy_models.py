"""Small models that the DDP and sharded-optimizer tests (and the grader) train.

Each one exists to exercise a specific way a data-parallel wrapper can go wrong:

- ToyModel: the course's plain MLP. If this fails, nothing else matters.
- ToyModelWithTiedWeights: one Parameter used by two modules (must be all-reduced once, not
  twice), a frozen Parameter (requires_grad=False: no grad, no hook, but still broadcast), and
  a randomly initialised buffer (must be broadcast too, or ranks compute different outputs).
- UnevenModel: parameters of very different sizes, in an order where naive round-robin
  sharding puts almost everything on rank 0; only numel-aware balancing passes.

All take (in_features, out_features) like the course's models, and every random number comes
from torch's global RNG, so `torch.manual_seed(s)` before construction fixes the weights.
"""
import torch
from torch import nn


class ToyModel(nn.Module):
    def __init__(self, in_features: int = 10, out_features: int = 5):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.fc2 = nn.Linear(10, 50)
        self.fc3 = nn.Linear(50, out_features)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)


class ToyModelWithTiedWeights(nn.Module):
    def __init__(self, in_features: int = 10, out_features: int = 5):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.fc2 = nn.Linear(10, 50)
        self.fc3 = nn.Linear(50, 10, bias=False)
        self.fc4 = nn.Linear(10, 50)
        self.fc5 = nn.Linear(50, out_features)
        self.relu = nn.ReLU()
        # Tie: fc4 and fc2 share one (50, 10) weight. module.parameters() yields it once, and
        # autograd sums both uses into one .grad before its post-accumulate hook fires.
        self.fc4.weight = self.fc2.weight
        # Frozen but used in forward: it must match across ranks (broadcast) yet gets no grad.
        self.frozen_scale = nn.Parameter(torch.rand(10) + 0.5, requires_grad=False)
        # Random on purpose, so ranks seeded differently disagree until the wrapper broadcasts.
        self.register_buffer("input_shift", 0.1 * torch.randn(in_features))

    def forward(self, x):
        x = self.relu(self.fc1(x + self.input_shift)) * self.frozen_scale
        x = self.relu(self.fc2(x))
        x = self.relu(self.fc3(x))
        x = self.relu(self.fc4(x))
        return self.fc5(x)


class UnevenModel(nn.Module):
    """Parameter numels, in parameters() order: 1024, 64, 2048, 32, 2048, 64, 256, 4.

    Round-robin puts every weight on rank 0 (5376 of 5540 elements); greedy numel
    balancing gets 3072 / 2468.
    """

    def __init__(self, in_features: int = 16, out_features: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 64)
        self.fc2 = nn.Linear(64, 32)
        self.fc3 = nn.Linear(32, 64)
        self.fc4 = nn.Linear(64, out_features)

    def forward(self, x):
        x = torch.tanh(self.fc1(x))
        x = torch.tanh(self.fc2(x))
        x = torch.tanh(self.fc3(x))
        return self.fc4(x)
