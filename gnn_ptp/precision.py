"""The six precision classes, named the same in every command, record and checkpoint.

A precision class fixes four things about a training step: the dtype the parameters are stored in,
whether (and to which dtype) autocast lowers the eligible ops, whether matmuls and cuDNN convolutions
may use TF32 tensor cores when they run in float32, and whether a GradScaler wraps the step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from gnn_ptp.errors import UserError, closest


@dataclass(frozen=True)
class Precision:
    name: str
    """Name used on the command line and in records (e.g. ``amp-bf16``)."""
    param_dtype: torch.dtype
    """Dtype of parameters, gradients and optimizer state."""
    autocast_dtype: torch.dtype | None
    """Dtype autocast lowers matmuls and convolutions to; None when autocast is off."""
    matmul_tf32: bool
    """``torch.backends.cuda.matmul.allow_tf32``: float32 matmuls on TF32 tensor cores."""
    cudnn_tf32: bool
    """``torch.backends.cudnn.allow_tf32``: float32 convolutions on TF32 tensor cores."""
    grad_scaler: bool
    """A GradScaler scales the loss, unscales and checks gradients, and updates its scale."""
    description: str

    @property
    def uses_autocast(self) -> bool:
        return self.autocast_dtype is not None

    @contextlib.contextmanager
    def backend_flags(self):
        """Set the TF32 switches of this class for the duration of a CUDA run, then restore them."""
        old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = self.matmul_tf32
        torch.backends.cudnn.allow_tf32 = self.cudnn_tf32
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in [
        Precision("fp32", torch.float32, None, False, False, False,
                  "strict float32: TF32 off for matmuls and cuDNN"),
        Precision("tf32", torch.float32, None, True, True, False,
                  "float32 storage, matmuls and convolutions on TF32 tensor cores"),
        Precision("torch-default", torch.float32, None, False, True, False,
                  "PyTorch out of the box: cuDNN convolutions in TF32, matmuls in float32"),
        Precision("amp-fp16", torch.float32, torch.float16, False, True, True,
                  "autocast to float16 with a GradScaler; float32 parameters"),
        Precision("amp-bf16", torch.float32, torch.bfloat16, False, True, False,
                  "autocast to bfloat16; float32 parameters"),
        Precision("bf16", torch.bfloat16, None, False, True, False,
                  "pure bfloat16: parameters, activations and optimizer state in bfloat16"),
    ]
}
PRECISION_NAMES: tuple[str, ...] = tuple(PRECISIONS)

# Precision classes that mean something different on a CPU: TF32 does not exist there, and float16
# autocast on CPU is not what anyone trains with. CPU records use only these.
CPU_PRECISIONS: tuple[str, ...] = ("fp32", "amp-bf16", "bf16")


def get_precision(name: str) -> Precision:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise UserError(
            f"unknown precision {name!r}; allowed: {', '.join(PRECISION_NAMES)}"
            + closest(name, PRECISION_NAMES)
        ) from None
