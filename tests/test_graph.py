"""The PyG graph: FLOPs against closed forms, free ops contracted, edges along data flow, dtype and
tensor-core features per precision class, graph-level features."""

from __future__ import annotations

import math

import pytest
import torch

from gnn_ptp import graph, ops
from gnn_ptp.precision import PRECISION_NAMES, get_precision
from gnn_ptp.spec import Shape
from gnn_ptp.trace import PHASES, StepConfig, trace_step

from conftest import GPT2, RANDOM_CNN, TEXT, VISION, compute_nodes, py_spec, step

# node feature columns (graph.to_data)
FLOPS, BYTES_READ, BYTES_WRITTEN, TENSOR_CORE, ALIGNED = 0, 1, 2, 13, 14


def log2p(x: float) -> float:
    return math.log2(1 + x)


def trace(factory: str, shape: Shape, precision: str = "fp32", kernels: str | None = None, **overrides):
    return trace_step(StepConfig(py_spec(factory, **overrides), shape, precision, kernels=kernels))


def kept(traced):
    """The fx nodes that become graph nodes, in graph order (what to_data keeps)."""
    return compute_nodes(traced)


def costs(traced, category: str | None = None, phase: str | None = None):
    precision = get_precision(traced.config.precision)
    out = []
    for n in kept(traced):
        c = ops.op_cost(n, precision)
        if (category is None or c.category == category) and (phase is None or n.meta["phase"] == phase):
            out.append(c)
    return out


# --- FLOPs against closed forms -------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
def test_linear_flops(bias):
    b, i, h, o = 4, 24, 40, 8
    traced = trace("mlp2", Shape(b), bias=bias, in_features=i, hidden=h, out_features=o)
    fwd = costs(traced, "matmul", "forward")
    assert [c.op for c in fwd] == (["addmm", "addmm"] if bias else ["mm", "mm"])
    assert [c.flops for c in fwd] == [2 * b * i * h, 2 * b * h * o]
    bwd = costs(traced, "matmul", "backward")
    # layer 2: grad of its input and of its weight; layer 1: only its weight (the batch needs no grad)
    assert sorted(c.flops for c in bwd) == sorted([2 * b * o * h, 2 * o * b * h, 2 * h * b * i])
    assert all(c.op == "mm" for c in bwd)


@pytest.mark.parametrize("k, stride, padding, groups", [(3, 1, 1, 1), (3, 2, 1, 4), (5, 1, 2, 8), (1, 1, 0, 1)])
def test_conv2d_flops(k, stride, padding, groups):
    b, cin, c1, c2, size = 2, 3, 16, 24, 16
    traced = trace("conv2", Shape(b, None, size), k=k, stride=stride, padding=padding, groups=groups,
                   cin=cin, c1=c1, c2=c2)
    out = (size + 2 * padding - k) // stride + 1
    conv1 = 2 * b * c1 * out * out * cin * k * k
    conv2 = 2 * b * c2 * out * out * c1 * k * k // groups
    fwd = costs(traced, "conv", "forward")
    assert [c.flops for c in fwd] == [conv1, conv2]
    assert fwd[1].out_shape == (b, c2, out, out)
    bwd = costs(traced, "conv", "backward")
    # conv2 computes grad input and grad weight (2x its forward); conv1 only grad weight (1x)
    assert sorted(c.flops for c in bwd) == sorted([2 * conv2, conv1])


@pytest.mark.parametrize("groups", [1, 4])
def test_conv_transpose_flops(groups):
    b, c1, c2, k, stride, size = 2, 8, 16, 3, 2, 8
    traced = trace("conv_transpose", Shape(b, None, size), c1=c1, c2=c2, k=k, stride=stride, groups=groups)
    conv1 = 2 * b * size * size * 3 * c1
    convt = 2 * b * size * size * c1 * (c2 // groups) * k * k  # every input pixel meets the whole filter
    assert [c.flops for c in costs(traced, "conv", "forward")] == [conv1, convt]
    assert sorted(c.flops for c in costs(traced, "conv", "backward")) == sorted([2 * convt, conv1])


@pytest.mark.parametrize("precision, kernel, kernels", [("amp-bf16", "flash_attention", "2.10.0"),
                                                      ("amp-bf16", "cudnn_attention", "2.11.0"),
                                                      ("fp32", "efficient_attention", None)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_flops(precision, kernel, kernels, causal):
    """Every attention kernel costs the same work: cuDNN attention (torch >= 2.11 on sm90) as flash."""
    b, h, s, d = 2, 2, 64, 32
    traced = trace("attention", Shape(b, s), precision, kernels, heads=h, head_dim=d, causal=causal)
    (fwd,) = costs(traced, "attention", "forward")
    (bwd,) = costs(traced, "attention", "backward")
    assert (fwd.op, bwd.op) == (kernel, kernel + "_backward")
    expected = 4 * b * h * s * s * d / (2 if causal else 1)
    assert fwd.flops == expected
    assert bwd.flops == 2.5 * expected  # five matmuls against two, causal halved as in the forward


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s, fraction", [(64, 1.0), (1024, 0.75)])
def test_attention_flops_cpu_kernels(precision, causal, s, fraction):
    """aten's CPU flash kernels, read causal in both directions (``is_causal`` is argument 7 of the CPU
    backward's schema, 11 on CUDA), cost the pairs of the key blocks they visit: all of them up to 512 keys,
    3/4 at 1,024 (CPU_FEATURE_REVISION 2; the backward was counted whole, the forward halved)."""
    b, h, d = 1, 2, 16
    traced = trace_step(StepConfig(py_spec("attention", heads=h, head_dim=d, causal=causal), Shape(b, s),
                                   precision, target="cpu"))
    (fwd,) = costs(traced, "attention", "forward")
    (bwd,) = costs(traced, "attention", "backward")
    assert (fwd.op, bwd.op) == ("flash_attention", "flash_attention_backward")
    (node,) = [n for n in kept(traced) if ops.canonical(n.target) == "flash_attention_backward"]
    assert node.target is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    assert (node.meta["in"][0][7] is True) == causal
    expected = 4 * b * h * s * s * d * (fraction if causal else 1.0)
    assert fwd.flops == expected
    assert bwd.flops == 2.5 * expected


def test_cpu_flash_causal_fraction_counts_the_key_blocks_visited():
    """Query blocks of 32 / 64 / 256 rows (from 192 and 768 tokens), key blocks of 512: a block is visited
    whole if it starts before the query block's last row."""
    assert [ops.cpu_flash_q_split(n) for n in (128, 191, 192, 767, 768)] == [32, 32, 64, 64, 256]
    assert all(ops.cpu_flash_causal_fraction(n, n) == 1.0 for n in (1, 32, 128, 257, 512))
    # 640 tokens, 10 query blocks of 64: the first 8 see 512 keys, the last 2 all 640
    assert ops.cpu_flash_causal_fraction(640, 640) == pytest.approx((8 * 64 * 512 + 2 * 64 * 640) / 640 ** 2)
    # 2,048 tokens, 8 query blocks of 256: 1, 1, 2, 2, 3, 3, 4, 4 key blocks of 512 of 4
    assert ops.cpu_flash_causal_fraction(2048, 2048) == pytest.approx(20 / 32)
    assert ops.cpu_flash_causal_fraction(1024, 1024) == 0.75


def test_feature_version_of_cpu_graphs_carries_their_revision():
    assert graph.feature_version("cuda") == graph.FEATURE_VERSION
    assert graph.feature_version("cpu") == f"{graph.FEATURE_VERSION}.{graph.CPU_FEATURE_REVISION}"


def test_attention_flops_gqa_counts_query_heads():
    from conftest import LLAMA

    traced = step(LLAMA, TEXT, "amp-bf16")
    (fa,) = costs(traced, "attention", "forward")
    b, s, heads, head_dim = 2, 16, 4, 16
    assert fa.flops == 4 * b * heads * s * s * head_dim / 2  # causal


def test_matmul_flops_in_node_features():
    traced = trace("mlp2", Shape(4))
    data, summary = graph.to_data(traced)
    flops = [c.flops for c in costs(traced)]
    assert torch.allclose(data.x[:, FLOPS], torch.tensor([log2p(f) for f in flops]))
    assert summary.flops == pytest.approx(sum(flops))
    for phase in PHASES:
        in_phase = [c.flops for c, n in zip(costs(traced), kept(traced)) if n.meta["phase"] == phase]
        assert summary.flops_by_phase[phase] == pytest.approx(sum(in_phase))
        assert summary.kernels_by_phase[phase] == len(in_phase)
        assert int((data.phase == PHASES.index(phase)).sum()) == len(in_phase)


# --- nodes and edges ------------------------------------------------------------------------------


@pytest.mark.parametrize("model, shape", [(GPT2, TEXT), (RANDOM_CNN, VISION)], ids=["gpt2", "random-cnn"])
def test_free_ops_never_become_nodes(model, shape):
    traced = step(model, shape, "amp-bf16")
    data, summary = graph.to_data(traced)
    all_calls = [n for n in traced.graph.nodes if n.op == "call_function"]
    free = [n for n in all_calls if ops.canonical(n.target) in ops.FREE_OPS]
    names = {ops.canonical(n.target) for n in free}
    assert {"view", "t", "detach"} & names, "the model should exercise views and detach"
    assert data.num_nodes == len(all_calls) - len(free) == summary.nodes
    assert summary.traced_nodes > summary.nodes
    assert data.x.shape == (data.num_nodes, graph.NODE_FEATURES)
    assert data.x_cat.shape == (data.num_nodes, 4) and data.phase.shape == (data.num_nodes,)
    assert not any(op in ops.OP_ID for op in ops.FREE_OPS)  # no vocabulary slot for them either
    op_names = [ops.canonical(n.target) for n in kept(traced)]
    assert "getitem" not in op_names and "view" not in op_names


def _reference_edges(traced) -> set[tuple[int, int]]:
    """Edges from first principles: a kept node depends on the kept nodes that produced its inputs,
    looking through free ops (views of views of ...)."""
    index = {n: i for i, n in enumerate(kept(traced))}

    def producers(node, seen=frozenset()):
        if node in index:
            return {index[node]}
        if node.op != "call_function" or node in seen:
            return set()
        out = set()
        for arg in node.all_input_nodes:
            out |= producers(arg, seen | {node})
        return out

    edges = set()
    for node, i in index.items():
        for arg in node.all_input_nodes:
            edges |= {(src, i) for src in producers(arg)}
    return edges


@pytest.mark.parametrize("model, shape", [(GPT2, TEXT), (RANDOM_CNN, VISION)], ids=["gpt2", "random-cnn"])
def test_edges_follow_data_dependencies(model, shape):
    traced = step(model, shape, "amp-fp16")
    data, _ = graph.to_data(traced)
    edges = set(map(tuple, data.edge_index.t().tolist()))
    assert edges == _reference_edges(traced)
    assert all(s < d for s, d in edges)  # the graph is a DAG in trace order
    assert data.edge_attr.shape == (len(edges), 1)


def test_edges_hand_checked_mlp():
    b, i, h, o = 4, 24, 40, 8
    traced = trace("mlp2", Shape(b), in_features=i, hidden=h, out_features=o)
    data, _ = graph.to_data(traced)
    names = [ops.canonical(n.target) for n in kept(traced)]
    fwd = names[:names.index("mse_loss") + 1]
    assert fwd == ["addmm", "relu", "addmm", "mse_loss"]
    edges = {tuple(e): float(a) for e, a in zip(data.edge_index.t().tolist(), data.edge_attr[:, 0])}
    assert (0, 1) in edges and (1, 2) in edges and (2, 3) in edges
    assert (0, 2) not in edges and (0, 3) not in edges  # no skip edges where there is no data flow
    assert edges[(0, 1)] == pytest.approx(log2p(b * h * 4))  # fp32 activations [b, h]
    # the weight update reads the gradient: an edge from each backward mm that makes a weight grad
    # into the optimizer kernels (through the in-place foreach chain)
    opt = [k for k, n in enumerate(kept(traced)) if n.meta["phase"] == "optimizer"]
    bwd = [k for k, n in enumerate(kept(traced)) if n.meta["phase"] == "backward"]
    assert any(s in bwd and d in opt for s, d in edges)
    # in-place foreach ops chain: the second write to the parameters depends on the first
    foreach_mul = [k for k in opt if names[k] == "_foreach_mul"][0]
    addcdiv = [k for k in opt if names[k] == "_foreach_addcdiv"][0]
    assert (foreach_mul, addcdiv) in edges


# --- dtypes and tensor cores per precision class --------------------------------------------------


def _by_category(traced, data, category):
    rows = [k for k, c in enumerate(costs(traced)) if c.category == category]
    dtypes = {ops.DTYPES[int(data.x_cat[k, 2])] for k in rows}
    tensor_core = {bool(data.x[k, TENSOR_CORE]) for k in rows}
    return dtypes, tensor_core


@pytest.mark.parametrize("precision, matmul, conv", [
    ("fp32", ("fp32", False), ("fp32", False)),
    ("tf32", ("tf32", True), ("tf32", True)),
    ("torch-default", ("fp32", False), ("tf32", True)),
    ("amp-bf16", ("bf16", True), ("bf16", True)),
    ("amp-fp16", ("fp16", True), ("fp16", True)),
    ("bf16", ("bf16", True), ("bf16", True)),
])
def test_dtype_and_tensor_core_flags(precision, matmul, conv):
    traced = step(RANDOM_CNN, VISION, precision)
    data, summary = graph.to_data(traced)
    assert _by_category(traced, data, "matmul") == ({matmul[0]}, {matmul[1]})
    assert _by_category(traced, data, "conv") == ({conv[0]}, {conv[1]})
    assert (summary.flops_by_dtype.get("tf32", 0) > 0) == (precision in ("tf32", "torch-default"))
    if precision == "fp32":
        assert summary.tensor_core_flop_share == 0
    if precision in ("tf32", "amp-bf16", "bf16"):
        assert summary.tensor_core_flop_share > 0.8  # a CNN is mostly convolution FLOPs


def test_same_trace_different_features_for_tf32_classes():
    fp32, tf32, default = (graph.to_data(step(RANDOM_CNN, VISION, p))[0] for p in ("fp32", "tf32", "torch-default"))
    assert torch.equal(fp32.edge_index, tf32.edge_index) and torch.equal(fp32.x_cat[:, 0], tf32.x_cat[:, 0])
    assert not torch.equal(fp32.x_cat[:, 2], tf32.x_cat[:, 2])
    assert not torch.equal(tf32.x_cat[:, 2], default.x_cat[:, 2])
    assert not torch.equal(fp32.u, tf32.u)


@pytest.mark.parametrize("precision, aligned", [("amp-bf16", False), ("tf32", True)])
def test_alignment_flag(precision, aligned):
    """in_features 20 is a multiple of 4 (TF32) but not of 8 (bf16 tensor cores)."""
    traced = trace("mlp2", Shape(8), precision, in_features=20, hidden=32, out_features=16)
    data, _ = graph.to_data(traced)
    first = next(k for k, c in enumerate(costs(traced)) if c.category == "matmul")
    assert bool(data.x[first, TENSOR_CORE])
    assert bool(data.x[first, ALIGNED]) == aligned


# --- graph-level features -------------------------------------------------------------------------


def test_graph_features():
    traced = step(GPT2, TEXT, "amp-fp16", optimizer="sgd")
    data, summary = graph.to_data(traced)
    assert len(graph.GRAPH_FEATURE_NAMES) == graph.GRAPH_FEATURES
    assert data.u.shape == (1, graph.GRAPH_FEATURES)
    u = dict(zip(graph.GRAPH_FEATURE_NAMES, data.u[0].tolist()))
    assert sum(u[f"precision={p}"] for p in PRECISION_NAMES) == 1 and u["precision=amp-fp16"] == 1
    assert u["optimizer=sgd"] == 1 and u["optimizer=adamw"] == 0
    assert u["log_batch"] == pytest.approx(log2p(2)) and u["log_seq_len"] == pytest.approx(log2p(16))
    assert u["log_image_size"] == 0
    assert u["log_params"] == pytest.approx(log2p(traced.param_count))
    assert u["log_flops_fp16"] > 0 and u["log_flops_bf16"] == 0
    assert u["tensor_core_flop_share"] == pytest.approx(summary.tensor_core_flop_share)
    assert u["log_kernels_optimizer"] == pytest.approx(log2p(summary.kernels_by_phase["optimizer"]))


def test_feature_version_and_summary_dict():
    assert isinstance(graph.FEATURE_VERSION, str) and graph.FEATURE_VERSION
    traced = step(GPT2, TEXT, "amp-bf16")
    data, summary = graph.to_data(traced)
    d = graph.summary_dict(traced, summary)
    assert d["feature_version"] == graph.FEATURE_VERSION
    assert d["nodes"] == data.num_nodes and d["edges"] == data.edge_index.shape[1]
    assert d["precision"] == "amp-bf16" and d["family"] == "gpt2" and d["params"] == traced.param_count
    assert d["flops"] == pytest.approx(sum(d["flops_by_phase"].values()))
    assert d["unseen_ops"] == summary.unseen_ops
    table = graph.summary_table(traced, summary)
    assert "amp-bf16" in table and "forward" in table and "tensor cores" in table


def test_node_categorical_features_in_range():
    data, _ = graph.to_data(step(GPT2, TEXT, "amp-bf16"))
    assert int(data.x_cat[:, 0].max()) < len(ops.VOCAB)
    assert int(data.x_cat[:, 1].max()) < len(ops.CATEGORIES)
    assert int(data.x_cat[:, 2].max()) < len(ops.DTYPES)
    assert set(data.x_cat[:, 3].tolist()) == {0, 1, 2}
    assert torch.isfinite(data.x).all() and torch.isfinite(data.u).all()


def test_canonical_names():
    aten = torch.ops.aten
    assert ops.canonical(aten.add_.Tensor) == "add"
    assert ops.canonical(aten.native_batch_norm.default) == "batch_norm"
    assert ops.canonical(aten.cudnn_batch_norm.default) == "batch_norm"
    assert ops.canonical(aten._scaled_dot_product_flash_attention.default) == "flash_attention"
    assert ops.canonical(aten._scaled_dot_product_cudnn_attention.default) == "cudnn_attention"
    assert ops.canonical(aten._scaled_dot_product_cudnn_attention_backward.default) == "cudnn_attention_backward"
    for op in ("cudnn_attention", "cudnn_attention_backward"):  # in the vocabulary from the start: no id moves
        assert ops.category(op) == "attention" and op in ops.OP_ID
    assert ops.canonical(aten._fused_rms_norm.default) == "rms_norm"
    assert ops.canonical(aten._foreach_add_.Scalar) == "_foreach_add"
    import operator

    assert ops.canonical(operator.getitem) == "getitem"
    assert ops.category("_foreach_whatever") == "optimizer" and ops.category("frobnicate") == "other"


def test_fresh_bytes_are_the_outputs_a_kernel_allocates():
    """Per node, ``fresh_bytes`` holds what the kernel allocates (every output its schema does not alias
    to an input) and its largest allocation: an out-of-place op its outputs, an in-place op or an ``out=``
    write nothing; a multi-output op each of its outputs (what a CPU page-faults above the mmap threshold)."""
    a = torch.zeros(4, 8)
    assert ops._fresh_outputs(torch.ops.aten.add_.Tensor, a) == []
    assert ops._fresh_outputs(torch.ops.aten.add.out, a) == []
    assert len(ops._fresh_outputs(torch.ops.aten.add.Tensor, a)) == 1
    three = (torch.zeros(4, 8), torch.zeros(4, 1), torch.zeros(4, 1))
    assert len(ops._fresh_outputs(torch.ops.aten.native_layer_norm.default, three)) == 3

    b, i, h, o = 4, 24, 40, 8
    traced = trace("mlp2", Shape(b), in_features=i, hidden=h, out_features=o)
    data, _ = graph.to_data(traced)
    assert data.fresh_bytes.shape == (data.num_nodes, 2) and data.fresh_bytes.dtype == torch.float64
    names = [ops.canonical(n.target) for n in kept(traced)]
    first = names.index("addmm")  # the forward's first linear: a fresh [b, h] fp32 output
    assert data.fresh_bytes[first].tolist() == [b * h * 4, b * h * 4]
    phase = data.phase.tolist()
    written_in_place = [k for k, n in enumerate(kept(traced))
                        if phase[k] == 2 and str(n.target).split(".")[-2].endswith("_")]
    assert written_in_place and all(data.fresh_bytes[k].tolist() == [0.0, 0.0] for k in written_in_place)
    assert bool((data.fresh_bytes[:, 1] <= data.fresh_bytes[:, 0]).all())


def test_conv_layout_marks_a_convolution_whose_input_is_channels_last():
    """``ops.conv_layout``: a convolution (forward: its first argument; fused backward: its second) whose
    4-d input torch reads as channels-last (``ops.channels_last_strides``, checked against torch's own rule
    on permuted tensors, ambiguous size-1 dims included) gets ``ops.CHANNELS_LAST`` in ``gemm_layout``; a
    contiguous input, a GEMM or any other op does not. A model moved to channels_last traces so on every
    convolution, forward and backward, and the code is never read as a GEMM layout
    (``prior.layout_factor``, ``prior.gemm_layouts_only``)."""
    from gnn_ptp import prior
    from gnn_ptp.hardware import Hardware

    x = torch.zeros(2, 8, 5, 5)
    cl = x.contiguous(memory_format=torch.channels_last)
    w, g = torch.zeros(8, 1, 3, 3), torch.zeros(2, 8, 5, 5)
    assert ops.conv_layout("convolution", (x, w)) == 0
    assert ops.conv_layout("convolution", (cl, w)) == ops.CHANNELS_LAST
    assert ops.conv_layout("convolution_backward", (g, cl, w)) == ops.CHANNELS_LAST
    assert ops.conv_layout("convolution_backward", (cl, x, w)) == 0  # the gradient's layout is not the input's
    assert ops.conv_layout("convolution", (torch.zeros(2, 8, 1, 1), w)) == 0
    assert ops.conv_layout("convolution", (torch.zeros(2, 1, 1, 8).permute(0, 3, 1, 2), w)) == ops.CHANNELS_LAST
    assert ops.conv_layout("convolution", (torch.zeros(2, 8, 5, 5).permute(0, 1, 3, 2), w)) == 0  # neither layout
    assert ops.conv_layout("add", (cl, cl)) == 0 and ops.CHANNELS_LAST >= len(ops.GEMM_LAYOUTS)
    from torch._prims_common import suggest_memory_format  # the rule torch's own Python side keeps

    for shape, order in (((2, 8, 1, 1), (0, 2, 3, 1)), ((2, 8, 1, 1), (0, 1, 2, 3)), ((1, 8, 1, 4), (0, 2, 3, 1)),
                         ((2, 1, 3, 3), (0, 2, 3, 1)), ((1, 1, 1, 1), (0, 2, 3, 1)), ((2, 3, 4, 5), (0, 3, 2, 1)),
                         ((1, 4, 1, 6), (0, 3, 2, 1)), ((3, 8, 2, 1), (0, 2, 3, 1)), ((2, 8, 4, 4), (0, 2, 3, 1))):
        t = torch.zeros([shape[i] for i in order]).permute(*[order.index(i) for i in range(4)])
        assert tuple(t.shape) == shape
        assert ops.channels_last_strides(tuple(t.shape), t.stride()) == (
            suggest_memory_format(t) == torch.channels_last), (shape, order, t.stride())

    for channels_last, expected in ((0, 0), (1, ops.CHANNELS_LAST)):
        traced = trace_step(StepConfig(py_spec("conv2", c1=16, c2=16, groups=16, channels_last=channels_last),
                                       Shape(4, None, 12), "fp32", target="cpu"))
        tensors, _ = graph.to_tensors(traced)
        conv = tensors["x_cat"][:, 1] == ops.CATEGORIES.index("conv")
        layout = tensors["gemm_layout"]
        assert int(conv.sum()) == 4 and set(layout[conv].tolist()) == {expected}
        assert set(layout[~conv].tolist()) <= set(range(len(ops.GEMM_LAYOUTS)))
    hw = Hardware("cpu-like", "a CPU", {"fp32": 1e11}, 1e10, 2e10, 1e9, kind="cpu", gemm_layout_ratio={"fp32:nt": 0.5})
    dtype = torch.zeros(layout.shape[0], dtype=torch.long)
    assert prior.layout_factor(hw, dtype, layout)[conv].tolist() == [1.0] * 4  # not a GEMM's ceiling
    assert prior.gemm_layouts_only(layout)[conv].tolist() == [0] * 4


def test_gemm_layout_says_which_operand_is_a_transposed_view():
    """``gemm_layout`` (``ops.GEMM_LAYOUTS``): a linear layer's forward is ``x @ W.t()`` ("nt"), its input
    gradient ``grad @ W`` ("nn") and its weight gradient ``grad.t() @ x`` ("tn"); every other kernel 0. On a
    CPU without a fast bf16 path these run at 1.3, 9 and 24 GFLOP/s (the fourth kind's descriptor)."""
    a, b = torch.zeros(6, 4), torch.zeros(4, 5)
    assert ops.GEMM_LAYOUTS[ops.gemm_layout("mm", (a, b))] == "nn"
    assert ops.GEMM_LAYOUTS[ops.gemm_layout("mm", (torch.zeros(4, 6).t(), b))] == "tn"
    assert ops.GEMM_LAYOUTS[ops.gemm_layout("addmm", (torch.zeros(5), a, torch.zeros(5, 4).t()))] == "nt"
    assert ops.GEMM_LAYOUTS[ops.gemm_layout("bmm", (torch.zeros(2, 4, 6).transpose(1, 2),
                                                      torch.zeros(2, 5, 4).transpose(1, 2)))] == "tt"
    assert ops.gemm_layout("add", (a, a)) == 0 and ops.gemm_layout("mm", (torch.zeros(4), b)) == 0
    assert ops.gemm_layout("mm", (torch.zeros(1, 4), b)) == ops.GEMM_LAYOUTS.index("nn")  # a row: either way

    traced = trace("mlp2", Shape(8), precision="bf16", in_features=24, hidden=40, out_features=8)
    data, _ = graph.to_data(traced)
    assert data.gemm_layout.shape == (data.num_nodes,) and data.gemm_layout.dtype == torch.long
    names = [ops.canonical(n.target) for n in kept(traced)]
    phase = data.phase.tolist()
    layout = [ops.GEMM_LAYOUTS[c] for c in data.gemm_layout.tolist()]
    forward = {layout[k] for k, n in enumerate(names) if n == "addmm" and phase[k] == 0}
    backward = sorted(layout[k] for k, n in enumerate(names) if n == "mm" and phase[k] == 1)
    assert forward == {"nt"}
    assert backward == ["nn", "tn", "tn"]  # the first layer needs no input gradient
    assert all(layout[k] == "" for k, n in enumerate(names) if n not in ("mm", "addmm", "bmm", "baddbmm"))
