"""The op vocabulary and what each op costs: canonical names, categories, FLOPs, bytes, compute dtype.

Canonical names fold together kernel variants that do the same work (``native_batch_norm`` on a CPU and
``cudnn_batch_norm`` on an H100; in-place ``add_`` and ``add``), so that a graph traced with one torch
build or device reads like one traced with another. The vocabulary is fixed here (its order is part of
FEATURE_VERSION); an op outside it keeps its category and is flagged as unseen at prediction time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils import flop_counter

# Ops that launch no kernel on a GPU: views, metadata, allocation. The graph drops them.
FREE_OPS = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand",
    "expand_as", "squeeze", "unsqueeze", "slice", "select", "alias", "detach", "getitem", "split",
    "split_with_sizes", "unbind", "as_strided", "narrow", "diagonal", "unfold", "view_as", "chunk",
    "movedim", "numpy_T", "lift_fresh_copy", "empty", "empty_like", "empty_strided", "sym_size",
    "sym_stride", "sym_numel", "lift_fresh", "_local_scalar_dense", "view_as_real", "view_as_complex", "_to_dense",
    "empty_permuted", "new_empty", "new_empty_strided", "resolve_conj", "resolve_neg", "lift",
    "_conj", "dim", "size", "stride",
}

ALIASES = {
    "native_batch_norm": "batch_norm", "_native_batch_norm_legit": "batch_norm",
    "_native_batch_norm_legit_functional": "batch_norm", "_native_batch_norm_legit_no_training": "batch_norm",
    "cudnn_batch_norm": "batch_norm", "miopen_batch_norm": "batch_norm", "_batch_norm_with_update": "batch_norm",
    "_batch_norm_with_update_functional": "batch_norm", "_batch_norm_no_update": "batch_norm",
    "native_batch_norm_backward": "batch_norm_backward", "cudnn_batch_norm_backward": "batch_norm_backward",
    "miopen_batch_norm_backward": "batch_norm_backward", "batch_norm_backward": "batch_norm_backward",
    "_log_softmax": "log_softmax", "_softmax": "softmax", "_safe_softmax": "softmax",
    "_log_softmax_backward_data": "log_softmax_backward", "_softmax_backward_data": "softmax_backward",
    "nll_loss_forward": "nll_loss", "nll_loss2d_forward": "nll_loss",
    "nll_loss2d_backward": "nll_loss_backward", "_to_copy": "to_copy", "copy": "copy",
    "_scaled_dot_product_flash_attention": "flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu": "flash_attention",
    "_scaled_dot_product_flash_attention_backward": "flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "flash_attention_backward",
    "_scaled_dot_product_efficient_attention": "efficient_attention",
    "_scaled_dot_product_efficient_attention_backward": "efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention": "cudnn_attention",
    "_scaled_dot_product_cudnn_attention_backward": "cudnn_attention_backward",
    "_fused_rms_norm": "rms_norm", "_fused_rms_norm_backward": "rms_norm_backward",
    "native_layer_norm": "layer_norm", "native_layer_norm_backward": "layer_norm_backward",
    "native_group_norm": "group_norm", "native_group_norm_backward": "group_norm_backward",
    "_adaptive_avg_pool2d": "adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward": "adaptive_avg_pool2d_backward",
    "max_pool2d_with_indices": "max_pool2d", "max_pool2d_with_indices_backward": "max_pool2d_backward",
    "_addmm_activation": "addmm", "scalar_tensor": "full", "zeros": "full", "ones": "full",
    "zeros_like": "full_like", "ones_like": "full_like", "new_zeros": "full", "new_ones": "full",
    "new_full": "full", "fill": "full_like", "bernoulli": "bernoulli", "rsub": "sub",
    "_unsafe_index": "index", "_unsafe_index_put": "index_put",
}

CATEGORIES = ("other", "matmul", "conv", "attention", "norm", "softmax", "elementwise", "reduction",
              "copy", "index", "creation", "random", "loss", "pool", "optimizer")

_CATEGORY_OF = {
    "matmul": ["mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "addbmm"],
    "conv": ["convolution", "convolution_backward", "cudnn_convolution", "_convolution"],
    "attention": ["flash_attention", "flash_attention_backward", "efficient_attention",
                  "efficient_attention_backward", "cudnn_attention", "cudnn_attention_backward"],
    "norm": ["batch_norm", "batch_norm_backward", "layer_norm", "layer_norm_backward", "group_norm",
             "group_norm_backward", "rms_norm", "rms_norm_backward"],
    "softmax": ["softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "logsumexp"],
    "reduction": ["sum", "mean", "amax", "amin", "max", "min", "var_mean", "var", "std", "prod", "argmax",
                  "argmin", "norm", "linalg_vector_norm", "cumsum", "any", "all"],
    "copy": ["to_copy", "clone", "copy", "cat", "stack", "constant_pad_nd", "slice_backward",
             "select_backward", "contiguous", "repeat", "repeat_interleave", "roll", "flip",
             "as_strided_scatter", "slice_scatter", "select_scatter", "tril", "triu"],
    "index": ["embedding", "embedding_dense_backward", "index", "index_select", "gather", "scatter",
              "scatter_add", "index_put", "index_add", "masked_fill", "masked_scatter", "nonzero", "where"],
    "creation": ["full", "full_like", "arange", "linspace", "eye"],
    "random": ["native_dropout", "native_dropout_backward", "bernoulli", "rand", "randn", "rand_like",
               "randn_like", "randint"],
    "loss": ["nll_loss", "nll_loss_backward", "mse_loss", "mse_loss_backward", "binary_cross_entropy_with_logits",
             "smooth_l1_loss", "l1_loss", "huber_loss", "kl_div"],
    "pool": ["max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
             "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward", "adaptive_max_pool2d",
             "adaptive_max_pool2d_backward", "avg_pool3d", "max_pool3d_with_indices",
             "upsample_nearest2d", "upsample_bilinear2d", "upsample_nearest2d_backward",
             "upsample_bilinear2d_backward"],
    "optimizer": ["_foreach_add", "_foreach_addcdiv", "_foreach_addcmul", "_foreach_div", "_foreach_lerp",
                  "_foreach_mul", "_foreach_sqrt", "_foreach_sub", "_foreach_neg", "_foreach_maximum",
                  "_foreach_copy", "_foreach_zero", "_foreach_norm", "_foreach_pow", "_foreach_reciprocal",
                  "_amp_foreach_non_finite_check_and_unscale", "_amp_update_scale", "_fused_adam",
                  "_fused_adamw", "_fused_sgd"],
}
_ELEMENTWISE = [
    "add", "sub", "mul", "div", "neg", "pow", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "relu",
    "gelu", "silu", "hardswish", "hardsigmoid", "leaky_relu", "elu", "mish", "softplus", "erf", "sin", "cos",
    "abs", "sign", "clamp", "clamp_min", "clamp_max", "minimum", "maximum", "reciprocal", "log1p", "expm1",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "bitwise_not",
    "bitwise_and", "bitwise_or", "floor", "ceil", "round", "fmod", "remainder", "addcmul", "addcdiv",
    "lerp", "threshold_backward", "gelu_backward", "silu_backward", "tanh_backward", "sigmoid_backward",
    "hardswish_backward", "hardsigmoid_backward", "leaky_relu_backward", "elu_backward", "mish_backward",
    "softplus_backward", "hardtanh", "hardtanh_backward", "floor_divide", "isinf", "isnan", "atan2",
    "rsub", "square", "reciprocal", "erfinv", "exp2", "log2", "log10", "trunc", "frac",
]
_CATEGORY_OF["elementwise"] = _ELEMENTWISE

CATEGORY: dict[str, str] = {op: cat for cat, ops in _CATEGORY_OF.items() for op in ops}

# The vocabulary: index 0 is every op not listed. Append only, and bump FEATURE_VERSION when you do.
VOCAB: tuple[str, ...] = ("<unseen>",) + tuple(dict.fromkeys(
    op for cat in CATEGORIES[1:] for op in _CATEGORY_OF[cat]))
OP_ID = {op: i for i, op in enumerate(VOCAB)}

DTYPES = ("none", "fp32", "tf32", "fp16", "bf16", "fp64", "int", "bool", "fp8")
DTYPE_ID = {d: i for i, d in enumerate(DTYPES)}
_DTYPE_NAME = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
               torch.bool: "bool", torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8"}
TENSOR_CORE_CATEGORIES = ("matmul", "conv", "attention")


def canonical(target) -> str:
    """Canonical op name of an fx call_function target (``aten.add_.Tensor`` -> ``add``)."""
    if target is getattr(__import__("operator"), "getitem"):
        return "getitem"
    name = getattr(target, "__name__", str(target))
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        name = packet.__name__
    name = name.split(".")[0]
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]  # in-place variant does the same work
    return ALIASES.get(name, name)


def category(op: str) -> str:
    if op in CATEGORY:
        return CATEGORY[op]
    if op.startswith("_foreach_"):
        return "optimizer"
    if "attention" in op:
        return "attention"
    if "norm" in op:
        return "norm"
    if "pool" in op or "upsample" in op:
        return "pool"
    if "loss" in op:
        return "loss"
    return "other"


def dtype_name(dtype: torch.dtype | None) -> str:
    if dtype is None:
        return "none"
    if dtype in _DTYPE_NAME:
        return _DTYPE_NAME[dtype]
    return "int" if not dtype.is_floating_point and not dtype.is_complex else "fp32"


@dataclass
class OpCost:
    op: str
    category: str
    dtype: str
    """The dtype the op runs in on the target: tf32 for float32 matmuls and convolutions allowed TF32."""
    flops: float
    bytes_read: float
    bytes_written: float
    out_shape: tuple[int, ...]
    in_shape: tuple[int, ...]
    n_tensors: int
    """Number of tensors a foreach op walks over (1 for ordinary ops)."""
    tensor_core: bool
    aligned: bool
    """Tensor-core op whose inner dimensions are multiples of 8 (fp16/bf16) or 4 (tf32)."""
    fresh_bytes: float = 0.0
    """Bytes of the outputs the op allocates (every output its schema does not alias to an input: not an
    in-place or ``out=`` write). On a CPU an allocation above the allocator's mmap threshold is
    page-faulted in as the kernel writes it (``prior.Profile.fresh_s_per_byte``)."""
    fresh_largest_bytes: float = 0.0
    """The largest of those outputs (the threshold applies per allocation)."""
    gemm_layout: int = 0
    """Index into ``GEMM_LAYOUTS`` of a two-operand GEMM's operand layout (``gemm_layout``); ``CHANNELS_LAST``
    for a convolution whose input is channels-last (``conv_layout``); 0 for any other op. On a CPU without a
    fast bf16 GEMM the kernel torch runs depends on a GEMM's (``prior.Profile.gemm_layouts``), and a depthwise
    convolution's on its input's (``prior.Profile.depthwise_probes``)."""


GEMM_LAYOUTS = ("", "nn", "nt", "tn", "tt")
"""Operand layouts of a GEMM ``a @ b`` as row-major torch sees them: "n" an operand whose rows are
contiguous, "t" one that is a transposed view (its column stride is not 1, its row stride is); "" not a
two-operand GEMM. An operand laid out neither way is copied to a contiguous one first, so it counts as "n".
On this project's fourth CPU kind (AMD EPYC family 25, no bf16 instructions) one thread runs a 512^3 bf16
GEMM at 1.3 GFLOP/s as nn and tt, 9.4 as nt (a linear layer's forward, ``x @ W.t()``) and 23.7 as tn (its
weight gradient, ``grad.t() @ x``), where fp32 runs all four at 83-90 (its descriptor's median of three runs;
README, *A fourth CPU kind*)."""
_GEMM_OPERANDS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2)}
"""Where a GEMM op's two matrix operands sit among its arguments."""


CHANNELS_LAST = len(GEMM_LAYOUTS)
"""The operand-layout code (graph.py's ``gemm_layout``, past ``GEMM_LAYOUTS``) of a convolution whose input torch
reads as channels-last (``conv_layout``): ConvNeXt's, whose blocks permute to channels-last
for their LayerNorm and linear layers and add the result back onto the block's input, and any model moved
``.to(memory_format=torch.channels_last)``. Torch runs another kernel for it: on one thread of the first CPU
kind a 7x7 depthwise convolution over 768 channels of 2x2 pixels takes 19-22 ms backward with a
channels-last input and 3.4 ms with a contiguous one, where its forward takes 0.06 against 3.4 ms
(``benchmarks/depthwise_probes.py``; README *Protocol*, "Channels-last depthwise convolutions")."""


def conv_layout(op: str, args) -> int:
    """``CHANNELS_LAST`` for a convolution (forward or its fused backward) whose 4-d input torch reads as
    channels-last (``channels_last_strides``: what ``Tensor::suggest_memory_format``, which picks the CPU
    convolution's kernel, says); 0 otherwise."""
    if op in ("convolution", "_convolution", "cudnn_convolution"):
        x = args[0] if args else None
    elif op == "convolution_backward":
        x = args[1] if len(args) > 1 else None
    else:
        return 0
    if not isinstance(x, (torch.Tensor, TensorMeta)) or x.dim() != 4:
        return 0
    return CHANNELS_LAST if channels_last_strides(tuple(x.shape), tuple(x.stride())) else 0


def channels_last_strides(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether torch takes a 4-d tensor of these sizes and strides for channels-last (c10's
    ``is_channels_last_strides_2d_s4``, behind ``suggest_memory_format``): its strides grow in the order C, W,
    H, N, ambiguous cases (size-1 dims with equal strides, a zero channel stride) going to contiguous. A
    ConvNeXt block's [N, 768, 1, 1] input, permuted from [N, 1, 1, 768], is channels-last by this rule though
    it is also contiguous, and torch runs it so."""
    if len(sizes) != 4 or strides[1] == 0:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < low:
            return False
        if d == 0 and low == strides[1]:
            return False
        low = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


def _transposed(t) -> bool:
    """Whether a matrix operand (its last two dims) is a transposed view: unit stride down its rows."""
    if t.dim() < 2:
        return False
    rows, cols = t.shape[-2], t.shape[-1]
    row_stride, col_stride = t.stride()[-2], t.stride()[-1]
    if cols == 1 or rows == 1:  # a vector either way: torch treats it as contiguous
        return False
    return col_stride != 1 and row_stride == 1


def gemm_layout(op: str, args) -> int:
    """``GEMM_LAYOUTS`` index of a GEMM op's operands (0 where ``op`` is not one or they are not matrices)."""
    where = _GEMM_OPERANDS.get(op)
    if where is None or len(args) <= max(where):
        return 0
    a, b = args[where[0]], args[where[1]]
    if not all(isinstance(t, (torch.Tensor, TensorMeta)) and t.dim() >= 2 for t in (a, b)):
        return 0
    return GEMM_LAYOUTS.index(("t" if _transposed(a) else "n") + ("t" if _transposed(b) else "n"))


class TensorMeta:
    """What a recorded tensor was (shape, strides, dtype, device) without keeping the tensor alive.
    Answers the few tensor methods the cost model asks."""

    __slots__ = ("shape", "dtype", "device", "_stride")

    def __init__(self, t: torch.Tensor):
        self.shape, self.dtype, self.device, self._stride = t.shape, t.dtype, t.device, t.stride()

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def dim(self) -> int:
        return len(self.shape)

    def stride(self) -> tuple[int, ...]:
        return self._stride

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def __repr__(self) -> str:
        return f"TensorMeta({tuple(self.shape)}, {self.dtype})"


def snapshot(x):
    """``x`` with every tensor replaced by its ``TensorMeta`` (lists, tuples and dicts walked)."""
    if isinstance(x, torch.Tensor):
        return TensorMeta(x)
    if isinstance(x, (list, tuple)):
        return type(x)(snapshot(v) for v in x) if not hasattr(x, "_fields") else tuple(snapshot(v) for v in x)
    if isinstance(x, dict):
        return {k: snapshot(v) for k, v in x.items()}
    return x


def _shapes(x):
    """``x`` with every tensor or TensorMeta replaced by its shape (what FLOP formulas read)."""
    if isinstance(x, (torch.Tensor, TensorMeta)):
        return x.shape
    if isinstance(x, (list, tuple)):
        return type(x)(_shapes(v) for v in x) if not hasattr(x, "_fields") else tuple(_shapes(v) for v in x)
    if isinstance(x, dict):
        return {k: _shapes(v) for k, v in x.items()}
    return x


def _tensors(x) -> list:
    """Every tensor (or TensorMeta) in ``x``, walking lists and tuples. A plain recursive function on
    purpose: a self-referencing closure would make a reference cycle that keeps the tensors alive."""
    if isinstance(x, (torch.Tensor, TensorMeta)):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _is_causal(target, args, kwargs) -> bool:
    """Whether an attention kernel call is causal: its ``is_causal`` argument, found by name in the kernel's
    schema (the CPU backward has it at 7, the CUDA flash and efficient backwards at 11, cuDNN's at 14)."""
    if "is_causal" in kwargs:
        return bool(kwargs["is_causal"])
    schema = getattr(target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    at = names.index("is_causal") if "is_causal" in names else None
    return at is not None and len(args) > at and args[at] is True


CPU_FLASH_Q_SPLITS = ((768, 256), (192, 64), (0, 32))
"""(least query length, query block rows) as aten's CPU flash attention picks its query block
(``flash_attention_kernel_impl`` and its backward in ``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``:
256 rows from 768 query positions, 64 from 192, else 32), its key block being ``CPU_FLASH_KV_SPLIT``."""
CPU_FLASH_KV_SPLIT = 512


def cpu_flash_q_split(q_len: int) -> int:
    """The query block aten's CPU flash attention runs a query length in (``CPU_FLASH_Q_SPLITS``)."""
    return next(rows for least, rows in CPU_FLASH_Q_SPLITS if q_len >= least)


def cpu_flash_causal_fraction(q_len: int, kv_len: int) -> float:
    """The share of a full attention's (query, key) pairs aten's CPU flash kernel computes when causal, in
    either direction: a query block starting at row m visits the key blocks (``CPU_FLASH_KV_SPLIT`` keys
    each, the last one short) that start before min(m + its rows, key length), each whole, so nothing is
    skipped up to 512 keys and the share falls to ~1/2 only over many key blocks. Measured on the first CPU
    kind (one thread, 1-8 x 2-4 heads x 64, fp32 and bf16, causal against full; README *Protocol*, "A causal
    CPU attention backward counted whole"): 0.98-1.02 at 128-512 tokens, 0.84-0.86 at 640, 0.75-0.76 at
    1,024, 0.63 at 2,048, where this gives 1, 0.84, 0.75 and 0.62."""
    rows, split = cpu_flash_q_split(q_len), CPU_FLASH_KV_SPLIT
    visited = 0
    for m in range(0, q_len, rows):
        block = min(rows, q_len - m)
        blocks = -(-min(m + block, kv_len) // split)  # key blocks started before its last row, each whole
        visited += block * min(blocks * split, kv_len)
    return visited / max(q_len * kv_len, 1)


def _attention_flops(target, op: str, args, kwargs) -> float:
    """FLOPs of a fused attention kernel: QK^T and PV (two matmuls) forward, five backward, over the (query,
    key) pairs it computes: all of them, or where causal half of them on a CUDA kernel (its tiles skip the
    masked ones) and on aten's CPU kernel the pairs of the key blocks it visits (``cpu_flash_causal_fraction``:
    nothing skipped up to 512 keys)."""
    q, k, v = args[0:3] if "backward" not in op else args[1:4]
    b, h, sq, d = q.shape
    sk, dv = k.shape[-2], v.shape[-1]
    fwd = 2.0 * b * h * sq * sk * (d + dv)
    work = fwd * (2.5 if "backward" in op else 1.0)  # backward: 5 matmuls against 2
    if not _is_causal(target, args, kwargs):
        return work
    cpu = getattr(target, "_overloadpacket", None) in _CPU_FLASH_KERNELS
    return work * (cpu_flash_causal_fraction(int(sq), int(sk)) if cpu else 0.5)


_CPU_FLASH_KERNELS = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
                      torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward)


def _matmul_conv_flops(target, args, kwargs, out) -> float:
    packet = getattr(target, "_overloadpacket", None)
    if packet is torch.ops.aten.convolution_backward and len(args) >= 11 and not kwargs:
        # torch's formula counts the weight gradient of a grouped convolution `groups` times over
        # (depthwise: once per channel). Each gradient asked for costs what the forward conv costs.
        grad_out, x, w, transposed, mask = args[0], args[1], args[2], args[7], args[10]
        fwd = flop_counter.conv_flop_count(list(x.shape), list(w.shape), list(grad_out.shape), transposed)
        return float(fwd * (bool(mask[0]) + bool(mask[1])))
    formula = flop_counter.flop_registry.get(packet)
    if formula is None:
        return 0.0
    try:
        return float(formula(*_shapes(args), **_shapes(kwargs), out_val=_shapes(out)))
    except Exception:  # a formula that does not know this overload: count nothing rather than guess
        return 0.0


_FLOPS_PER_ELEMENT = {"norm": 5.0, "softmax": 5.0, "loss": 2.0, "reduction": 1.0, "elementwise": 1.0,
                      "optimizer": 3.0, "pool": 1.0, "random": 2.0}


def op_cost(node, precision) -> OpCost:
    """Cost of one fx call_function node traced by ``trace.trace_step`` (meta['val'] set)."""
    op = canonical(node.target)
    cat = category(op)
    args, kwargs = node.meta["in"]
    inputs = _tensors((args, list(kwargs.values())))
    unique_inputs = list({id(t): t for t in inputs}.values())
    out = node.meta.get("val")
    outputs = _tensors(out)
    bytes_read = float(sum(_nbytes(t) for t in unique_inputs))
    bytes_written = float(sum(_nbytes(t) for t in outputs))
    out_main = outputs[0] if outputs else None
    in_main = inputs[0] if inputs else None
    n_tensors = len(_tensors(args[0])) if cat == "optimizer" and args else 1

    if cat in ("matmul", "conv"):
        flops = _matmul_conv_flops(node.target, args, kwargs, out)
    elif cat == "attention":
        flops = _attention_flops(node.target, op, args, kwargs)
    elif cat == "optimizer":
        flops = _FLOPS_PER_ELEMENT["optimizer"] * sum(t.numel() for t in outputs)
    elif cat in ("reduction", "softmax", "norm", "loss"):
        flops = _FLOPS_PER_ELEMENT[cat] * (in_main.numel() if in_main is not None else 0)
    elif cat in _FLOPS_PER_ELEMENT:
        flops = _FLOPS_PER_ELEMENT[cat] * (out_main.numel() if out_main is not None else 0)
    else:
        flops = 0.0

    floats = [t for t in (outputs + inputs) if t.is_floating_point()]
    if cat in TENSOR_CORE_CATEGORIES and inputs:
        dtype = dtype_name(in_main.dtype)
        if dtype == "fp32" and cat in ("matmul", "conv"):
            allowed = precision.matmul_tf32 if cat == "matmul" else precision.cudnn_tf32
            dtype = "tf32" if allowed else "fp32"
    elif floats:
        dtype = dtype_name(floats[0].dtype)
    else:
        dtype = dtype_name((outputs + inputs)[0].dtype) if (outputs or inputs) else "none"
    tensor_core = cat in TENSOR_CORE_CATEGORIES and dtype in ("tf32", "fp16", "bf16", "fp8")
    aligned = False
    if tensor_core:
        step = 4 if dtype == "tf32" else 8
        dims = [t.shape[-1] for t in inputs if t.dim() >= 1] + [t.shape[-2] for t in inputs if t.dim() >= 2]
        aligned = all(d % step == 0 for d in dims)
    fresh = [_nbytes(t) for t in _fresh_outputs(node.target, out)]
    return OpCost(op, cat, dtype, flops, bytes_read, bytes_written,
                  tuple(out_main.shape) if out_main is not None else (),
                  tuple(in_main.shape) if in_main is not None else (),
                  n_tensors, tensor_core, aligned, float(sum(fresh)), float(max(fresh, default=0)),
                  gemm_layout(op, args) if cat == "matmul" else conv_layout(op, args) if cat == "conv" else 0)


def _fresh_outputs(target, out) -> list:
    """The tensors of ``out`` (a node's recorded value) that ``target`` allocates: per its schema, the
    returns that alias no input (an in-place op's self, an ``out=`` argument and a view are not new
    memory). An op without a schema (a Python function) counts every output as new."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return _tensors(out)
    returns = schema.returns
    values = list(out) if len(returns) > 1 and isinstance(out, (list, tuple)) else [out]
    return [t for r, v in zip(returns, values) if r.alias_info is None for t in _tensors(v)]


def log_shape(shape: tuple[int, ...], width: int = 4) -> list[float]:
    """The last ``width`` dims, log2(1 + d), right-aligned and zero-padded on the left."""
    dims = list(shape[-width:])
    return [0.0] * (width - len(dims)) + [math.log2(1 + d) for d in dims]
