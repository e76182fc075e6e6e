"""A reply's tensors, from the runner to the harness: one file per call in the exchange folder.

The runner writes a reply's tensors to `<exchange>/<tag>.pt` (save); the harness reads them
back (read) only from that file, the one this call's tag names, never from a path the runner
chose, never through a link or from a FIFO, never more than MAX_TENSOR_FILE bytes, unpickled
with `weights_only`, into a dict of plain dense real tensors on the CPU. The file is removed
once opened, whatever it holds. The tag is the harness's unguessable name for one call, so a
forged file cannot match it.

Both halves live here so that they agree on the file's name. The runner imports this module
before any submission's code, so it imports only torch and the standard library.
"""
import io
import os
import stat
import warnings
from pathlib import Path

import torch

MAX_TENSOR_FILE = 4 << 30  # bytes of one reply's tensors


def tensors_file(exchange, tag: str) -> Path:
    """The one file a call's tensors travel in."""
    return Path(exchange) / f"{tag}.pt"


def save(exchange, tag: str, tensors: dict) -> str:
    """The runner's half: write `tensors` (non-tensor values dropped) on the CPU; the file's path."""
    path = tensors_file(exchange, tag)
    torch.save({k: v.detach().cpu() for k, v in tensors.items() if isinstance(v, torch.Tensor)}, path)
    return str(path)


def read(exchange, path, tag: str) -> dict:
    """The harness's half: the reply's tensors, read only from the file this call's tag names in
    the exchange folder (never a path the runner chose), not through a link, and only plain dense
    tensors. Raises ValueError, saying what was wrong, for anything else."""
    expected = tensors_file(exchange, tag)
    if path != str(expected):
        raise ValueError("the reply named a file outside the exchange folder")
    try:
        fd = os.open(expected, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"the tensors file could not be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_TENSOR_FILE:
            raise ValueError("the tensors file is not a regular file of a sane size")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read()
    finally:
        os.close(fd)
        try:
            os.unlink(expected)
        except OSError:
            pass
    try:
        with warnings.catch_warnings():  # a forged file's pickle protocol, say: not our warning
            warnings.simplefilter("ignore")
            tensors = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"the tensors file could not be read ({type(exc).__name__})") from None
    if not isinstance(tensors, dict):
        raise ValueError(f"expected a dict of tensors, got {type(tensors).__name__}")
    for name, value in tensors.items():
        if not isinstance(name, str) or type(value) is not torch.Tensor:
            raise ValueError(f"{str(name)[:40]!r} is not a plain tensor")
        if value.layout != torch.strided or value.is_quantized or value.is_complex():
            raise ValueError(f"{name} is not a dense real tensor")
    return tensors
