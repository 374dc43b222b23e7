"""Checks on the torch tensors handed to zinfinity._C, which takes raw addresses."""

import torch

DTYPE_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}


def dtype_name(tensor: torch.Tensor, what: str) -> str:
    try:
        return DTYPE_NAMES[tensor.dtype]
    except KeyError:
        raise ValueError(f"{what}: dtype {tensor.dtype}; expected float32, bfloat16 or float16") from None


def check_cpu(tensor: torch.Tensor, what: str, contiguous: bool = True) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: on {tensor.device}; zinfinity works on CPU tensors")
    if tensor.is_sparse:
        raise ValueError(f"{what}: sparse tensors are not supported")
    if contiguous and not tensor.is_contiguous():
        raise ValueError(f"{what}: not contiguous; call .contiguous() first")
