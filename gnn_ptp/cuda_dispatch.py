"""Make a trace on fake CPU tensors record what an H100 runs: CUDA autocast dtypes and CUDA kernel choices.

Why: tracing on real CUDA tensors needs a GPU, and fake CUDA tensors abort the CPU-only wheel in the
backward pass. So we trace on fake CPU tensors and, for the duration of a trace, re-register three things
in PyTorch's dispatcher (with ``torch.library``, undone on exit):

1. **Autocast.** Every op that has a CUDA autocast kernel gets a Python kernel on the ``AutocastCPU``
   key that applies the CUDA policy (the lists in ``ATen/autocast_mode.h``, vendored below); ops that
   only CPU autocast touches fall through untouched. Because the kernels sit at the same place in the
   dispatch order as the real ones, composite ops behave as on a GPU: ``cross_entropy`` calls
   ``log_softmax`` with an explicit dtype (so it stays in half precision) and ``nll_loss`` upcasts.
   The casts are real ``_to_copy`` ops, so autograd gives the backward pass the right dtypes.
2. **Attention.** ``scaled_dot_product_attention`` picks the kernel an sm90 GPU (H100, H200) picks, by
   the checks of PyTorch's ``select_sdp_backend`` (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``,
   ``sdp_utils_cpp.h``) as the torch version being followed has them (``KernelChoices``). The first
   backend whose checks pass runs, in the order cuDNN, flash, memory-efficient, math from torch 2.11 on
   (``check_prefer_cudnn_attention``: cuDNN newer than 9.15.0 on sm90; torch 2.11.0+cu130 ran with cuDNN
   9.19 on the H200, 2.14.1's wheel pins 9.24), flash, memory-efficient, math before. On dense 4-d inputs:

   - cuDNN: fp16/bf16; head dims multiples of 8 and <= 128 (or 192 for q/k with 128 for v); from 2.14 up
     to 256, with a backward only for <= 128, 192/128 and 256/256; a mask only if it needs no gradient,
     is 2-d or 4-d broadcastable to [B, H, L, S] and has a unit last stride; grouped-query attention
     (``enable_gqa``); any dropout in 2.11, from 2.12 only a multiple of 1/16 (so BERT's and GPT-2's 0.1
     runs cuDNN with 2.11 and flash with 2.14); key length > 1, query length > 1 with dropout.
   - flash: fp16/bf16, no mask, one head dim <= 256, ``is_causal`` only with as many queries as keys.
   - memory-efficient: fp16/bf16/fp32, head dims multiples of 8 (4 in fp32), any mask with a unit last
     stride, grouped-query attention from 2.14 (before: the math path).
   - math: the rest (fp64, unaligned head dims, a mask with a strided last dim).

   Sources: sdp_utils.cpp of a 2026 PyTorch main snapshot (commit 001f694), checked against the checks
   and messages compiled into torch 2.14.1+cu130's libtorch_cuda.so; the 2.11/2.14 differences dated by
   their pull requests (pytorch#174245 for 1/16 dropout, after the 2.11 branch cut; cudnn-frontend 1.24
   and cuDNN > 9.22 for head dim 256); and the per-op profiles of the H200 harvest of 2026-11-24 (torch
   2.11.0+cu130, cuDNN 9.19), which this rule reproduces call for call: every fp16/bf16 SDPA ran cuDNN
   (BERT, RoBERTa, GPT-2, OPT with dropout 0.1; Llama, Mistral, Qwen2 with GQA; ViT; random
   transformers; T5's cross-attention), fp32 ran memory-efficient attention, and the math path ran for
   GQA in fp32 and for T5's self-attention, whose position-bias mask transformers 5.17 passes permuted
   (last stride = heads; later transformers make it contiguous, and then cuDNN still refuses it because
   it needs a gradient, so half precision runs memory-efficient attention).
3. **Fused kernels.** CUDA runs dropout as one ``native_dropout`` kernel (the CPU composes bernoulli,
   div and mul), ``rms_norm`` as ``_fused_rms_norm`` (the CPU decomposes it), and a float16 input's
   float32 softmax as one ``_softmax(half_to_float=True)`` (the CPU casts first).

Everything else (batch norm, convolutions, embeddings, losses) records the same aten ops on both devices
up to names, which ``ops.canonical`` folds together (``native_batch_norm`` vs ``cudnn_batch_norm``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_map

from gnn_ptp.errors import UserError

aten = torch.ops.aten

# --- The CUDA autocast policy (ATen/autocast_mode.h, AT_FORALL_* lists; torch 2.11-2.14). -------------
LOWER_PRECISION = {
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    # registered for CUDA outside the shared lists
    "cudnn_convolution", "cudnn_convolution_transpose", "_cudnn_rnn",
}
FP32 = {
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm",
    "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
    "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
    "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa", "linalg_matrix_sqrth",
}
FP32_SET_OPT_DTYPE = {
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
}
FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE = {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add"}
BANNED = {"binary_cross_entropy"}
POLICY_OPS = LOWER_PRECISION | FP32 | FP32_SET_OPT_DTYPE | set(FP32_APPEND_DTYPE) | PROMOTE | BANNED


@functools.cache
def _ops_with_kernel(key: str) -> frozenset[str]:
    """aten ops with a kernel registered for a dispatch key (e.g. ``AutocastCUDA``) in this build."""
    names = torch._C._dispatch_get_all_op_names()
    return frozenset(n.removeprefix("aten::") for n in names
                     if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, key))


def _overload(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload or "default")


def _eligible(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64


class _Autocast:
    """The state of one emulated CUDA autocast region: its dtype and its cast cache."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def cast(self, x, to: torch.dtype):
        if isinstance(x, (list, tuple)):
            return type(x)(self.cast(t, to) for t in x)
        if not _eligible(x) or x.dtype == to:
            return x
        # autocast caches the lowered copy of a leaf fp32 parameter for the whole region (cached_cast)
        cacheable = (to == self.dtype and x.dtype == torch.float32 and x.requires_grad and x.is_leaf)
        if cacheable and id(x) in self.cache and self.cache[id(x)][0] is x:
            return self.cache[id(x)][1]
        y = x.to(to)
        if cacheable:
            self.cache[id(x)] = (x, y)
        return y

    def kernel(self, name: str):
        op = _overload(name)
        exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

        def run(*args, **kwargs):
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                return op(*args, **kwargs)

        if name in BANNED:
            def banned(*args, **kwargs):
                raise RuntimeError(
                    f"torch.nn.functional.{name} is unsafe to autocast on CUDA (PyTorch refuses it); "
                    "use binary_cross_entropy_with_logits / BCEWithLogitsLoss")
            return banned
        if name in LOWER_PRECISION:
            return lambda *a, **k: run(*self.cast(a, self.dtype), **{n: self.cast(v, self.dtype)
                                                                      for n, v in k.items()})
        if name in FP32:
            return lambda *a, **k: run(*self.cast(a, torch.float32),
                                       **{n: self.cast(v, torch.float32) for n, v in k.items()})
        if name in FP32_SET_OPT_DTYPE:
            dtype_pos = [i for i, arg in enumerate(op._schema.arguments) if arg.name == "dtype"][0]

            def set_opt_dtype(*a, **k):
                if _eligible(a[0]) and k.get("dtype") is None and (len(a) <= dtype_pos or a[dtype_pos] is None):
                    a = a[:dtype_pos]
                    k = {**k, "dtype": torch.float32}
                return run(*a, **k)
            return set_opt_dtype
        if name in FP32_APPEND_DTYPE:
            target = _overload(FP32_APPEND_DTYPE[name])

            def append_dtype(*a, **k):
                if _eligible(a[0]):
                    with torch._C._ExcludeDispatchKeyGuard(exclude):
                        return target(*a, **k, dtype=torch.float32)
                return run(*a, **k)
            return append_dtype
        if name in PROMOTE:
            def promote(*a, **k):
                wide = any(_eligible(t) and t.dtype == torch.float32 for t in _tensors((a, k)))
                to = torch.float32 if wide else self.dtype
                return run(*self.cast(a, to), **{n: self.cast(v, to) for n, v in k.items()})
            return promote
        raise KeyError(name)


def _tensors(tree) -> list[torch.Tensor]:
    out = []
    tree_map(lambda x: out.append(x) if isinstance(x, torch.Tensor) else None, tree)
    return out


# --- Kernel choices an H100 makes. ------------------------------------------------------------------

DISPATCH_VERSION = "2"
"""Version of the kernel choices below, in the cache keys of every CUDA-target graph (``dataset``,
``prediction``, ``node_labels``); CPU-target graphs and FEATURE_VERSION do not depend on it. Bump it when
a choice changes what a CUDA trace records. 1: flash attention first. 2: cuDNN attention first from torch
2.11 on (sm90), masks that require grad or have a strided last dim refused as PyTorch refuses them."""

_HALF = (torch.float16, torch.bfloat16)


def _heads_ok(q, k, v, enable_gqa: bool, gqa: bool, same_kv_heads: bool) -> bool:
    """``check_batch_size_and_num_heads_dense<gqa, same_kv_heads, supports_mqa=true>`` (sdp_utils_cpp.h):
    one batch size; with ``enable_gqa`` (where the kernel takes it) the query heads a multiple of the
    key/value heads; otherwise the same heads, or key and value with one head (multi-query)."""
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if enable_gqa and gqa:
        if same_kv_heads and hk != hv:
            return False
        return hk > 0 and hv > 0 and hq % hk == 0 and hq % hv == 0
    return (hq == hk == hv) or (hq > 0 and hk == hv == 1)


def _last_dim_stride_1(q, k, v, attn_mask, ignore_singleton: bool) -> bool:
    """``check_last_dim_stride_equals_1_dense``: q, k, v (and, on a GPU, the mask) have a unit stride in
    their last dim. A mask built by permuting (HF T5's position bias before transformers made it
    contiguous) fails here: every fused kernel refuses it and the math path runs."""
    ok = all(t.stride(-1) == 1 for t in (q, k, v)) or (ignore_singleton and q.shape[-1] == 1)
    return ok and (attn_mask is None or attn_mask.stride(-1) == 1)


def _mask_shape_ok(q, k, attn_mask) -> bool:
    """``check_attn_mask_shape`` (cuDNN only): no mask, or one that needs no gradient, 2-d or 4-d,
    broadcastable to [batch, heads, L, S] with each dim either the full size or 1."""
    if attn_mask is None:
        return True
    if attn_mask.requires_grad or attn_mask.dim() not in (2, 4):
        return False
    if attn_mask.shape[-2] not in (q.shape[-2], 1) or attn_mask.shape[-1] not in (k.shape[-2], 1):
        return False
    return attn_mask.dim() == 2 or (attn_mask.shape[0] in (q.shape[0], 1) and attn_mask.shape[1] in (q.shape[1], 1))


def _cudnn_ok(q, k, v, attn_mask, dropout_p: float, enable_gqa: bool, needs_grad: bool,
              choices: "KernelChoices") -> bool:
    """``can_use_cudnn_attention`` (cuda/sdp_utils.cpp) on an sm90 GPU, dense inputs."""
    if not (q.dtype in _HALF and q.dtype == k.dtype == v.dtype):  # check_dtypes_low_precision
        return False
    if not _mask_shape_ok(q, k, attn_mask):
        return False
    if choices.cudnn_dropout_sixteenths and dropout_p * 16.0 != math.floor(dropout_p * 16.0):
        return False  # check_cudnn_dropout: cuDNN's dropout resolution is 1/16 (torch >= 2.12)
    b, h, s_q, d_qk = q.shape
    s_k, d_v = k.shape[-2], v.shape[-1]
    if s_q == 0 or s_k == 0 or not _last_dim_stride_1(q, k, v, attn_mask, ignore_singleton=True):
        return False
    if not _heads_ok(q, k, v, enable_gqa, gqa=True, same_kv_heads=False):
        return False
    # check_cudnn_tensor_shapes
    if b > 65535 or h > 65535:
        return False
    if choices.cudnn_head_dim_256:
        limit = 256
    else:
        limit = 192 if (d_qk, d_v) == (192, 128) else 128
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False
    if s_k == 1 or (dropout_p != 0.0 and s_q == 1):
        return False
    # check_cudnn_d256_bprop_head_dim: with head dims past 128 the backward takes only (192, 128), (256, 256)
    if needs_grad and choices.cudnn_head_dim_256:
        return (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))
    return True


def _flash_ok(q, k, v, attn_mask, is_causal: bool, enable_gqa: bool) -> bool:
    """``can_use_flash_attention`` on sm90: fp16/bf16, no mask, one head dim <= 256, causal only with
    square attention, GQA."""
    return (q.dtype in _HALF and q.dtype == k.dtype == v.dtype and attn_mask is None
            and q.shape[-1] == k.shape[-1] == v.shape[-1] <= 256
            and not (is_causal and q.shape[-2] != k.shape[-2])
            and q.shape[-2] > 0 and k.shape[-2] > 0
            and _heads_ok(q, k, v, enable_gqa, gqa=True, same_kv_heads=True)
            and _last_dim_stride_1(q, k, v, None, ignore_singleton=True))


def _efficient_ok(q, k, v, attn_mask, enable_gqa: bool, choices: "KernelChoices") -> bool:
    """``can_use_mem_efficient_attention`` on sm90: fp16/bf16/fp32, head dims aligned (8 in half precision,
    4 in fp32), any mask with a unit last stride; grouped-query attention from torch 2.14."""
    head_dim, v_dim = q.shape[-1], v.shape[-1]
    align = 8 if q.dtype in _HALF else 4
    grouped = enable_gqa and q.shape[-3] != k.shape[-3]
    return (q.dtype == k.dtype == v.dtype and q.dtype != torch.float64
            and head_dim == k.shape[-1] and head_dim % align == 0 and v_dim % align == 0
            and q.shape[-2] > 0 and k.shape[-2] > 0
            and (not grouped or choices.efficient_gqa)
            and _heads_ok(q, k, v, enable_gqa, gqa=choices.efficient_gqa, same_kv_heads=True)
            and _last_dim_stride_1(q, k, v, attn_mask, ignore_singleton=False))


def attention_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask, enable_gqa: bool,
                      dropout_p: float = 0.0, is_causal: bool = False, needs_grad: bool | None = None,
                      choices: "KernelChoices | None" = None) -> str:
    """The SDPA backend PyTorch picks on an H100/H200 (sm90) for these inputs: cudnn, flash, efficient or
    math. ``select_sdp_backend`` tries the backends in priority order and takes the first whose checks
    pass; from torch 2.11 the order starts with cuDNN attention (see ``KernelChoices.cudnn_first``).
    ``needs_grad`` defaults to whether q, k or v require grad (with grad mode on)."""
    choices = choices or _active or kernel_choices()
    if not (q.dim() == k.dim() == v.dim() == 4):  # check_tensor_shapes: every fused kernel wants 4-d
        return "math"
    if needs_grad is None:
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if choices.cudnn_first and _cudnn_ok(q, k, v, attn_mask, dropout_p, enable_gqa, needs_grad, choices):
        return "cudnn"
    if _flash_ok(q, k, v, attn_mask, is_causal, enable_gqa):
        return "flash"
    if _efficient_ok(q, k, v, attn_mask, enable_gqa, choices):
        return "efficient"
    return "math"


def _minor_version(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise UserError(f"torch version {version!r} is not <major>.<minor>[.<patch>]") from None


@dataclasses.dataclass(frozen=True)
class KernelChoices:
    """The H100/H200 kernel choices of one torch version (its wheel for CUDA 13 and the cuDNN it pins),
    which a trace follows."""

    torch_version: str
    efficient_gqa: bool
    """Memory-efficient attention takes grouped-query attention (torch >= 2.14); before, the math path."""
    cudnn_first: bool = False
    """cuDNN attention heads SDPA's priority order on sm90 (``check_prefer_cudnn_attention``: cuDNN newer
    than 9.15.0 on sm90/sm100): torch >= 2.11 with the cuDNN its CUDA 13 wheel brings (9.19 with 2.11.0 on
    the H200, 9.24 pinned by 2.14.1). Before: flash, efficient, math."""
    cudnn_dropout_sixteenths: bool = False
    """cuDNN attention refuses a dropout probability that is not a multiple of 1/16 (torch >= 2.12,
    pytorch#174245): BERT's or GPT-2's 0.1 runs cuDNN with 2.11 and flash with 2.14."""
    cudnn_head_dim_256: bool = False
    """cuDNN attention takes head dims up to 256 on sm90, its backward only (<=128, <=128), (192, 128)
    and (256, 256) (torch >= 2.14: cuDNN 9.24 > 9.22 and cudnn-frontend >= 1.24). Before: up to 128, and
    (192, 128)."""


def kernel_choices(torch_version: str | None = None) -> KernelChoices:
    """The kernel choices of ``torch_version`` (a record's own torch), or of the installed torch.

    A trace can follow an older torch's choices on a newer torch (the math path exists everywhere), not
    a newer one's on an older torch whose kernels lack the feature: that is a user error that says so.
    The cuDNN choices are bookkeeping by version: a fake-tensor trace runs only the cuDNN attention op's
    meta kernels, which any torch has that can trace these models (checked with 2.13.0+cpu and 2.14.1)."""
    if torch_version is None:
        return dataclasses.replace(choices_of(torch.__version__),
                                   efficient_gqa=efficient_attention_supports_gqa())
    choices = choices_of(torch_version)
    if choices.efficient_gqa and not efficient_attention_supports_gqa():
        raise UserError(f"records measured with torch {torch_version} ran grouped-query attention in the "
                        f"memory-efficient kernel, which the installed torch {torch.__version__} cannot trace; "
                        "install torch >= 2.14 to trace them")
    return choices


def choices_of(torch_version: str) -> KernelChoices:
    """What torch ``torch_version`` chooses on sm90, by its version alone (no check that the installed torch
    can trace it: ``kernel_choices`` does that). Read from the sources for 2.14 and confirmed on an H200 for
    2.11; 2.12 and 2.13 are placed by the merge dates of the changes against their branch cuts, and
    versions before 2.11 are taken as flash-first (their cuDNN preference depends on the cuDNN they
    shipped with; no record was measured with one)."""
    minor = _minor_version(torch_version)
    return KernelChoices(torch_version, efficient_gqa=minor >= (2, 14), cudnn_first=minor >= (2, 11),
                         cudnn_dropout_sixteenths=minor >= (2, 12), cudnn_head_dim_256=minor >= (2, 14))


_active: KernelChoices | None = None  # set by cuda_semantics for the duration of a trace


@functools.cache
def efficient_attention_supports_gqa() -> bool:
    """Whether this torch's memory-efficient attention takes grouped-query attention (fewer key/value
    heads than query heads). Torch 2.14 added it; before that sdp_utils.cpp refused GQA for the kernel
    and the H100 fell back to the math path. We ask the installed torch (its meta kernel for the
    backward, which gained per-tensor head counts with the feature) rather than compare version
    strings, so the trace follows the torch the user will train with."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():  # a probe, not part of any trace that may be recording
        q = torch.empty(1, 4, 8, 8, device="meta")
        kv = torch.empty(1, 2, 8, 8, device="meta")
        try:
            out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, kv, kv, None, True)
            grads = aten._scaled_dot_product_efficient_attention_backward(
                out, q, kv, kv, None, out, lse, seed, offset, 0.0, [True, True, True, False])
        except RuntimeError:
            return False
    return tuple(grads[1].shape) == tuple(kv.shape)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    backend = attention_backend(query, key, value, attn_mask, enable_gqa, dropout_p, is_causal, needs_grad)
    if backend == "cudnn":
        # attention.cpp: a boolean mask becomes an additive one in the query's dtype (convert_boolean_attn_
        # mask_cudnn); the cuDNN op takes it unexpanded and GQA key/value heads as they are
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.where(attn_mask, 0.0, torch.scalar_tensor(-math.inf, dtype=query.dtype))
        return aten._scaled_dot_product_cudnn_attention(query, key, value, attn_mask, needs_grad, dropout_p,
                                                        is_causal, False, scale=scale)[0]
    if backend == "flash":
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                        False, scale=scale)[0]
    if backend == "efficient":
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.where(attn_mask, 0.0, -math.inf).to(query.dtype)
        if attn_mask is not None:
            attn_mask = attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, needs_grad,
                                                            dropout_p, is_causal, scale=scale)[0]
    if enable_gqa and query.shape[-3] != key.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    return aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal,
                                                   None, scale=scale)[0]


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    return aten._fused_rms_norm(x, normalized_shape, weight, eps)[0]


def _fused_rms_norm_cpu(x, normalized_shape, weight=None, eps=None):
    """Only there so that CPU dispatch uses ``_fused_rms_norm``'s autograd formula, as CUDA does."""
    dims = tuple(range(-len(normalized_shape), 0))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    rstd = torch.rsqrt(x.float().pow(2).mean(dims, keepdim=True) + eps)
    out = (x.float() * rstd).to(x.dtype)
    return (out * weight if weight is not None else out), rstd


def _half_to_float(x, dtype) -> bool:
    """CUDA computes a float16 input's float32 (log_)softmax in one kernel, with no cast first. Only
    fake tensors can take that path here: the CPU kernel has no half_to_float."""
    return x.dtype == torch.float16 and dtype == torch.float32 and isinstance(x, FakeTensor)


def _softmax(x, dim, dtype=None):
    if _half_to_float(x, dtype):
        return aten._softmax(x, dim, True)
    return aten._softmax(x.to(dtype) if dtype is not None else x, dim, False)


def _log_softmax(x, dim, dtype=None):
    if _half_to_float(x, dtype):
        return aten._log_softmax(x, dim, True)
    return aten._log_softmax(x.to(dtype) if dtype is not None else x, dim, False)


def _dropout(x, p, train):
    if train and 0 < p < 1 and x.numel() > 0:
        return aten.native_dropout(x, p, train)[0]
    if train and p == 1:
        return x * 0
    return x


@contextlib.contextmanager
def cuda_semantics(autocast_dtype: torch.dtype | None, kernels: str | None = None):
    """Within this context, ops on CPU tensors dispatch as on an H100 (see the module docstring).

    ``autocast_dtype`` is the autocast dtype of the precision class, or None when autocast is off;
    ``kernels`` the torch version whose kernel choices to follow (None: the installed torch).
    Yields a callable that opens an autocast region (use it around forward + loss only, as users do).
    """
    global _active
    previous_choices, _active = _active, kernel_choices(kernels)  # probes before any trace records
    lib = torch.library.Library("aten", "IMPL")
    state = _Autocast(autocast_dtype or torch.bfloat16)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            lib.impl("scaled_dot_product_attention", _sdpa, "AutogradCPU")
            lib.impl("dropout", _dropout, "AutogradCPU")
            lib.impl("softmax.int", _softmax, "AutogradCPU")
            lib.impl("log_softmax.int", _log_softmax, "AutogradCPU")
            if _has_fused_rms_norm():  # CUDA runs rms_norm as one fused kernel (torch >= 2.8)
                lib.impl("rms_norm", _rms_norm, "AutogradCPU")
                lib.impl("_fused_rms_norm", _fused_rms_norm_cpu, "CPU")
            if autocast_dtype is not None:
                for name in sorted(autocast_cuda_ops() & POLICY_OPS):
                    lib.impl(name, state.kernel(name), "AutocastCPU")
                for name in sorted(_ops_with_kernel("AutocastCPU") - POLICY_OPS):
                    lib.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")

        @contextlib.contextmanager
        def autocast_region():
            if autocast_dtype is None:
                yield
                return
            prev = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
            torch.set_autocast_enabled("cpu", True)
            torch.set_autocast_dtype("cpu", autocast_dtype)
            torch.autocast_increment_nesting()
            try:
                yield
            finally:
                torch.autocast_decrement_nesting()
                torch.set_autocast_enabled("cpu", prev[0])
                torch.set_autocast_dtype("cpu", prev[1])
                state.cache.clear()

        yield autocast_region
    finally:
        lib._destroy()
        _active = previous_choices


@functools.cache
def _has_fused_rms_norm() -> bool:
    return (hasattr(aten, "_fused_rms_norm")
            and torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "CUDA"))


def autocast_cuda_ops() -> frozenset[str]:
    """The ops that have a CUDA autocast kernel in this torch build (both wheels compile them in)."""
    return _ops_with_kernel("AutocastCUDA")


@contextlib.contextmanager
def cpu_semantics(autocast_dtype: torch.dtype | None, kernels: str | None = None):
    """The CPU as it is: PyTorch's own CPU autocast and CPU kernels, for targets that are CPUs."""

    @contextlib.contextmanager
    def autocast_region():
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            yield

    yield autocast_region
