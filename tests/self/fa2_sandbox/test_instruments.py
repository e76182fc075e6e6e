"""What the runner watches: DtypeWatch sees the dtype of what a forward computes, whether or not
a layer's own forward runs (the FSDP check of compute_dtype, grading/checks/test_fsdp.py)."""
import torch
import torch.nn.functional as F

from fa2_sandbox.runner.instruments import DtypeWatch


def test_dtype_watch_sees_what_was_computed_not_which_module_ran():
    layer = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(3, 8)
    with DtypeWatch() as fp32:
        F.linear(x, layer.weight)  # the layer's function without its forward: hooks see nothing
    with DtypeWatch() as fp16:
        F.linear(x.half(), layer.weight.detach().half())
    assert fp32.dtypes == {"float32"}
    assert "float16" in fp16.dtypes
    with DtypeWatch() as ints:
        torch.arange(5) + 1
    assert ints.dtypes == set()  # integer tensors are no compute dtype
