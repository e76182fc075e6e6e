"""What the grader and the runner's ranks both need to train the same model on the same data:
the toy models by name, their batches drawn from a seed, the loss, and the adapters each DDP
flavour names. The grader trains the single-process baseline with these; the ranks train the
submission's wrapper with the same."""
import torch
import torch.nn.functional as F

from fa2_sandbox.wire.toy_models import BufferedModel, CourseTokenModel, ToyModel, ToyModelWithTiedWeights, UnevenModel

MODELS = {"toy": ToyModel, "tied": ToyModelWithTiedWeights, "buffered": BufferedModel, "uneven": UnevenModel,
          "course": CourseTokenModel}
FEATURES = {"toy": (10, 5), "tied": (10, 5), "buffered": (10, 5), "uneven": (16, 4)}  # (in, out)

DDP_FLAVOURS = {
    # flavour: (wrap, on_after_backward, on_train_batch_start or None)
    "ddp": ("get_ddp", "ddp_on_after_backward", None),
    "individual": ("get_ddp_individual_parameters", "ddp_individual_parameters_on_after_backward", None),
    "bucketed": ("get_ddp_bucketed", "ddp_bucketed_on_after_backward", "ddp_bucketed_on_train_batch_start"),
}


def build_model(name: str, seed: int) -> torch.nn.Module:
    """The reference toy model `name`, initialised from `seed`, leaving the global RNG alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name]()


def make_batches(name: str, seed: int, steps: int, batch: int):
    """(x, y) of shapes (steps, batch, in) and (steps, batch, out) for model `name`; for the
    course's token model, token ids (steps, batch, SEQ) and a label per sequence (steps, batch)."""
    g = torch.Generator().manual_seed(seed)
    if name == "course":
        vocab, seq = CourseTokenModel.VOCAB, CourseTokenModel.SEQ
        return (torch.randint(0, vocab, (steps, batch, seq), generator=g),
                torch.randint(0, vocab, (steps, batch), generator=g))
    n_in, n_out = FEATURES[name]
    return torch.randn(steps, batch, n_in, generator=g), torch.randn(steps, batch, n_out, generator=g)


def training_loss(name: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss model `name` trains on, in float32: the official FSDP tests' cross-entropy of the
    last position's logits for the token model, mean squared error for the others."""
    if name == "course":
        return F.cross_entropy(out[:, -1, :].float(), y)
    return F.mse_loss(out.float(), y)
