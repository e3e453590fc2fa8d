"""Reference forward passes under PyTorch's REAL CUDA autocast kernels, without a GPU.

Run as a script (the tests start it in a subprocess, so that anything that aborts on fake CUDA tensors
cannot take pytest down with it):

    python tests/real_cuda_autocast.py < cases.json > sequences.json

Each case is ``{"id", "spec", "set", "batch_size", "seq_len", "image_size", "precision"}``. The model is
built on the meta device, then run forward + loss on fake ``cuda`` tensors (FakeTensorMode) with the
C-level CUDA autocast state switched on, so the AutocastCUDA kernels compiled into the CUDA wheel decide
every dtype. A TorchDispatchMode writes down, for every op that launches a kernel, its canonical name
and the dtypes of its outputs.

Two things are not what an H100 would run and are normalised on this side:
- ``scaled_dot_product_attention`` without a GPU picks the math path (a dozen ops in fp32). It is
  intercepted after autocast (at AutogradCUDA) and recorded as one ``sdpa`` entry with the dtypes of
  q, k, v and the output; the math path then runs unrecorded, and its output gets the memory layout
  of the fused kernels.
- copies from the host (``torch.tensor(...)`` created on the CPU, then ``.to('cuda')``) have no
  counterpart in a trace made on CPU tensors; they are left out.
"""

from __future__ import annotations

import json
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gnn_ptp import ops
from gnn_ptp.precision import get_precision
from gnn_ptp.spec import Shape, build, parse_spec


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _dtype(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, tuple[str, ...]]] = []
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused or func.namespace == "prim":
            return out
        op = ops.canonical(func)
        if op in ops.FREE_OPS:
            return out
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        if op == "to_copy" and inputs and outputs and inputs[0].device != outputs[0].device:
            return out  # host-to-device copy
        self.ops.append((op, tuple(_dtype(t.dtype) for t in outputs)))
        return out


def run_case(case: dict) -> list:
    spec = parse_spec(case["spec"], case.get("set") or {})
    shape = Shape(case["batch_size"], case.get("seq_len"), case.get("image_size"))
    precision = get_precision(case["precision"])
    workload = build(spec, shape, "meta", precision.param_dtype)
    recorder = Recorder()

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        recorder.paused += 1
        try:
            out = torch.ops.aten._scaled_dot_product_attention_math(
                query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
                enable_gqa=enable_gqa)[0]
            # the fused kernels return [B, H, S, D] views of a [B, S, H, D] buffer: callers that
            # transpose back and reshape then need no copy
            out = out.transpose(1, 2).contiguous().transpose(1, 2)
        finally:
            recorder.paused -= 1
        recorder.ops.append(("sdpa", tuple(_dtype(t.dtype) for t in (query, key, value, out))))
        return out

    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    with fake_mode:
        def fake(t):
            if not isinstance(t, torch.Tensor):
                return t
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                       device="cuda").requires_grad_(t.requires_grad)

        params = {k: fake(v) for k, v in workload.model.named_parameters()}
        buffers = {k: fake(v) for k, v in workload.model.named_buffers()}
        args = tuple(fake(a) for a in workload.args)
        kwargs = {k: fake(v) for k, v in workload.kwargs.items()}
        targets = {k: fake(v) for k, v in workload.targets.items()}

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("scaled_dot_product_attention", sdpa, "AutogradCUDA")
    previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", precision.autocast_dtype)
    torch.autocast_increment_nesting()
    try:
        with fake_mode, recorder:
            output = torch.func.functional_call(workload.model, (params, buffers), args, kwargs, strict=False)
            workload.loss_fn(output, **targets)
    finally:
        torch.autocast_decrement_nesting()
        torch.set_autocast_enabled("cuda", previous[0])
        torch.set_autocast_dtype("cuda", previous[1])
        torch.clear_autocast_cache()
        lib._destroy()
    return recorder.ops


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore")
    cases = json.load(sys.stdin)
    result = {}
    for case in cases:
        try:
            result[case["id"]] = {"ops": run_case(case)}
        except Exception as e:  # reported per case, so that one failure does not hide the others
            result[case["id"]] = {"error": f"{type(e).__name__}: {e}"}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
