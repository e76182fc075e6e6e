"""Small models that the DDP and sharded-optimizer tests (and the grader) train.

Each one exists to exercise a specific way a data-parallel wrapper can go wrong:

- ToyModel: the course's plain MLP. If this fails, nothing else matters.
- ToyModelWithTiedWeights: one Parameter used by two modules (must be all-reduced once, not
  twice), a frozen Parameter (requires_grad=False: no grad, no hook, but still broadcast: it is
  a weight), and a buffer used in forward. The buffer comes from a fixed generator, so it is
  the same on every rank whatever the seed: a wrapper that broadcasts the weights (what the
  handout asks) and not the buffers still trains this model right.
- BufferedModel: the course's MLP plus a buffer drawn from the global RNG, so ranks seeded
  differently disagree on it until the wrapper broadcasts buffers too (beyond the handout,
  which names the weights only; BatchNorm statistics and random buffers need it).
- UnevenModel: parameters of very different sizes, in an order where round-robin sharding by
  count puts almost all the state on rank 0. That meets the handout (about 1/world_size of the
  parameters); only numel-aware balancing passes the advice check state_balanced.
- CourseTokenModel: the official FSDP tests' model (tests/test_fsdp.py, ToyFSDPModel): token ids
  through an Embedding, RMSNorms and bias-free Linears. The handout's FSDP wraps "any Linear or
  Embedding layer" of the course's model, which students find by their cs336_basics classes, so
  the FSDP ranks build it from the submission's cs336_basics.model (`course_layers`) as the
  official tests do; the grader trains this file's twin, with the same math and weights.

All but CourseTokenModel take (in_features, out_features) like the course's models, and every
random number but the tied model's buffer comes from torch's global RNG, so
`torch.manual_seed(s)` before construction fixes the weights.
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
        # Used in forward, equal on every rank (a fixed generator, not the global RNG): the
        # handout asks DDP to broadcast the weights, not buffers (BufferedModel checks those).
        fixed = torch.Generator().manual_seed(20250)
        self.register_buffer("input_shift", 0.1 * torch.randn(in_features, generator=fixed))

    def forward(self, x):
        x = self.relu(self.fc1(x + self.input_shift)) * self.frozen_scale
        x = self.relu(self.fc2(x))
        x = self.relu(self.fc3(x))
        x = self.relu(self.fc4(x))
        return self.fc5(x)


class BufferedModel(ToyModel):
    """ToyModel with a random buffer used in forward: seeded differently, ranks disagree on it."""

    def __init__(self, in_features: int = 10, out_features: int = 5):
        super().__init__(in_features, out_features)
        self.register_buffer("input_shift", 0.1 * torch.randn(in_features))

    def forward(self, x):
        return super().forward(x + self.input_shift)


class UnevenModel(nn.Module):
    """Parameter numels, in parameters() order: 1024, 64, 2048, 32, 2048, 64, 256, 4.

    Round-robin by count puts every weight on rank 0 (5376 of 5540 elements, 4 of 8
    parameters); greedy numel balancing gets 3072 / 2468 (2 and 6 parameters).
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


class CourseLinear(nn.Linear):
    """cs336_basics.model.Linear's math, x @ W^T with W of shape (d_out, d_in) and no bias; an
    nn.Linear, so wrappers that look for nn.Linear find it too."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)


class CourseRMSNorm(nn.Module):
    """cs336_basics.model.RMSNorm's math: in float32, eps 1e-5, back to the input's dtype."""

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        in_dtype = x.dtype
        x = x.to(torch.float32)
        return (self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(in_dtype)


class CourseTokenModel(nn.Module):
    """The official FSDP tests' ToyFSDPModel (vocab 100, d_model 64, d_ff 128), from the layer
    classes given: this file's twins by default, or the submission's cs336_basics.model ones."""

    VOCAB, SEQ = 100, 8

    def __init__(self, embedding=nn.Embedding, linear=CourseLinear, norm=CourseRMSNorm, d_model=64, d_ff=128):
        super().__init__()
        self.embedding = embedding(self.VOCAB, d_model)
        self.norm1 = norm(d_model)
        self.linear1 = linear(d_model, d_ff)
        self.norm2 = norm(d_ff)
        self.linear2 = linear(d_ff, d_model)
        self.lm_head = linear(d_model, self.VOCAB)

    def forward(self, tokens):
        x = self.linear1(self.norm1(self.embedding(tokens)))
        return self.lm_head(self.linear2(self.norm2(torch.relu(x))))


def course_layers(twin: CourseTokenModel) -> tuple[nn.Module, str]:
    """`twin` rebuilt from the submission's cs336_basics.model Embedding, Linear and RMSNorm, with
    twin's weights: (model, where its layers come from). Falls back to `twin` itself, saying why,
    when those classes cannot be imported or do not hold the course's parameters."""
    try:
        from cs336_basics.model import Embedding, Linear, RMSNorm
    except Exception as exc:  # noqa: BLE001 (any failure of student code: say it, use the twin)
        return twin, f"torch.nn layers (from cs336_basics.model import Embedding, Linear, RMSNorm failed: {exc!r})"
    try:
        model = CourseTokenModel(Embedding, Linear, RMSNorm)
        model.load_state_dict(twin.state_dict())
    except Exception as exc:  # noqa: BLE001
        return twin, (f"torch.nn layers (cs336_basics.model's Embedding, Linear and RMSNorm do not hold the "
                      f"course's parameters: {exc!r})")
    return model, "cs336_basics.model's Embedding, Linear and RMSNorm"
