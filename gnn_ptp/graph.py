"""A traced training step as a PyTorch Geometric graph: one node per GPU kernel, edges for data flow.

Views, reshapes, getitem, detach and allocations launch no kernel, so they are contracted away: their
consumers link straight to the op that produced the data. Nothing else is merged, so every node is one
kernel launch and its features say what that kernel does (op, dtype it runs in, phase, shapes, FLOPs,
bytes, tensor-core use).

Tensors of a ``Data``:
- ``x_cat`` [N, 4] long: op id, category id, dtype id, phase id (embedded by the GNN)
- ``x`` [N, NODE_FEATURES] float: log-scaled FLOPs, bytes, intensity, shapes, tensor-core flags
- ``edge_index`` [2, E], ``edge_attr`` [E, 1]: log2(1 + bytes passed along the edge)
- ``u`` [1, GRAPH_FEATURES]: precision, optimizer, input sizes, parameters, FLOPs per dtype and phase
- ``phase`` [N]: 0 forward, 1 backward, 2 optimizer (per-phase readout sums over it)
- ``grad_bytes`` [N]: parameter-gradient bytes each kernel finalises (not a feature: for the
  all-reduce overlap model)
- ``fresh_bytes`` [N, 2]: bytes of the outputs each kernel allocates, and the largest of them (not a
  feature: for the prior's page-fault cost of fresh CPU allocations, ``prior.Profile.fresh_s_per_byte``)
- ``gemm_layout`` [N] long: a two-operand GEMM's operand layout (``ops.GEMM_LAYOUTS``), ``ops.CHANNELS_LAST``
  for a convolution with a channels-last input, 0 for other kernels; not a feature: for a CPU prior fitted
  with per-layout GEMM ceilings (``prior.Profile.gemm_layouts``) or one that prices channels-last depthwise
  convolutions from the hardware's probes (``prior.Profile.depthwise_probes``)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from gnn_ptp import ops
from gnn_ptp.precision import PRECISION_NAMES, get_precision
from gnn_ptp.trace import OPTIMIZERS, PHASES, TracedStep

FEATURE_VERSION = "4"  # 2: causal attention backward and grouped-conv backward FLOPs fixed
# 3: float16 softmax with a float32 result is one kernel, as on CUDA
# 4: CPU targets trace the single-tensor optimizer torch.optim runs on CPUs (step counters included);
#    GradScaler's per-device copies; .backward() instead of autograd.grad
CPU_FEATURE_REVISION = "2"
"""Revision of what only CPU-target graphs record, on top of FEATURE_VERSION (``feature_version``). 1: the CPU
flash-attention backward (``_scaled_dot_product_flash_attention_for_cpu_backward``) is read causal where its
schema has ``is_causal`` (argument 7; it was looked for at the CUDA kernels' 11, so a causal CPU backward was
counted whole while its forward was halved). 2: a causal CPU flash kernel, either direction, is counted over
the key blocks it visits (``ops.cpu_flash_causal_fraction``: whole up to 512 keys), not halved."""


def feature_version(target: str) -> str:
    """The version of the features a graph of trace target ``target`` ("cpu" or "cuda") is built at:
    FEATURE_VERSION, and for CPU targets ``CPU_FEATURE_REVISION`` after it, so a change in what only CPU
    graphs record rebuilds their caches and refuses checkpoints trained on them while CUDA graphs, their caches
    and the checkpoints trained on them stay valid."""
    return FEATURE_VERSION if target == "cuda" else f"{FEATURE_VERSION}.{CPU_FEATURE_REVISION}"


LAYOUT_VERSION = "2"
"""Version of the per-node attributes that are not features (``gemm_layout``): 2 marks a convolution's
channels-last input. Graph caches are keyed by it (``dataset._cache_path``, ``prediction._graph_key``), so a
graph traced before carries it; checkpoints are not (``FEATURE_VERSION`` is theirs)."""
NODE_FEATURES = 16
FLOP_DTYPES = ("fp32", "tf32", "fp16", "bf16")
GRAPH_FEATURE_NAMES = (
    [f"precision={p}" for p in PRECISION_NAMES] + [f"optimizer={o}" for o in OPTIMIZERS]
    + ["log_batch", "log_seq_len", "log_image_size", "log_params"]
    + [f"log_flops_{d}" for d in FLOP_DTYPES] + [f"log_flops_{p}" for p in PHASES]
    + [f"log_bytes_{p}" for p in PHASES] + [f"log_kernels_{p}" for p in PHASES]
    + ["tensor_core_flop_share"]
)
GRAPH_FEATURES = len(GRAPH_FEATURE_NAMES)


def _log(x: float) -> float:
    return math.log2(1.0 + max(x, 0.0))


@dataclass
class StepSummary:
    """What ``gnn-ptp graph`` prints: the cost structure of one training step, before any prediction."""

    nodes: int
    edges: int
    traced_nodes: int
    params: int
    flops_by_phase: dict[str, float] = field(default_factory=dict)
    bytes_by_phase: dict[str, float] = field(default_factory=dict)
    kernels_by_phase: dict[str, int] = field(default_factory=dict)
    flops_by_dtype: dict[str, float] = field(default_factory=dict)
    bytes_by_dtype: dict[str, float] = field(default_factory=dict)
    tensor_core_flop_share: float = 0.0
    unseen_ops: dict[str, int] = field(default_factory=dict)

    @property
    def flops(self) -> float:
        return sum(self.flops_by_phase.values())


def to_data(traced: TracedStep):
    """Convert a traced step into ``(torch_geometric.data.Data, StepSummary)``."""
    from torch_geometric.data import Data

    tensors, summary = to_tensors(traced)
    data = Data(**tensors)
    data.num_nodes = tensors["x"].shape[0]
    return data, summary


def to_tensors(traced: TracedStep) -> tuple[dict[str, torch.Tensor], StepSummary]:
    """The graph's tensors (``Data`` fields: x, x_cat, edge_index, edge_attr, u, phase, grad_bytes,
    fresh_bytes, gemm_layout) and summary, without importing torch_geometric (a forked trace worker need not pay for it)."""
    precision = get_precision(traced.config.precision)
    nodes = list(traced.graph.nodes)
    source: dict[torch.fx.Node, dict[int, float]] = {}  # fx node -> {kept index: bytes it carries}
    x_cat, x, phase = [], [], []
    edges: dict[tuple[int, int], float] = {}
    costs: list[ops.OpCost] = []
    grad_bytes: list[float] = []  # parameter-gradient bytes each kernel finalises (for DDP overlap)
    fresh: list[tuple[float, float]] = []  # bytes each kernel allocates, and its largest allocation
    layout: list[int] = []  # each GEMM's operand layout (ops.GEMM_LAYOUTS)

    def carried(n: torch.fx.Node) -> dict[int, float]:
        return source.get(n, {})

    for node in nodes:
        if node.op != "call_function":
            continue
        op = ops.canonical(node.target)
        inputs = []
        torch.fx.node.map_arg((node.args, node.kwargs), inputs.append)
        if op in ops.FREE_OPS:
            merged: dict[int, float] = {}
            for n in inputs:
                merged.update(carried(n))
            source[node] = merged
            if node.meta.get("grad_bytes") and merged:  # a gradient that is a view of a kernel's output
                grad_bytes[next(iter(merged))] += node.meta["grad_bytes"]
            continue
        cost = ops.op_cost(node, precision)
        index = len(costs)
        costs.append(cost)
        for n, t in _input_pairs(node):
            for src in carried(n):
                edges[(src, index)] = edges.get((src, index), 0.0) + t.numel() * t.element_size()
        source[node] = {index: cost.bytes_written}
        grad_bytes.append(float(node.meta.get("grad_bytes", 0)))
        fresh.append((cost.fresh_bytes, cost.fresh_largest_bytes))
        layout.append(cost.gemm_layout)
        phase_id = PHASES.index(node.meta.get("phase", "forward"))
        phase.append(phase_id)
        x_cat.append([ops.OP_ID.get(cost.op, 0), ops.CATEGORIES.index(cost.category),
                      ops.DTYPE_ID[cost.dtype], phase_id])
        intensity = cost.flops / (cost.bytes_read + cost.bytes_written + 1.0)
        numel_out = math.prod(cost.out_shape) if cost.out_shape else 0
        x.append([_log(cost.flops), _log(cost.bytes_read), _log(cost.bytes_written), _log(intensity),
                  *ops.log_shape(cost.out_shape), *ops.log_shape(cost.in_shape),
                  _log(cost.n_tensors), float(cost.tensor_core), float(cost.aligned), _log(numel_out)])

    summary = _summarize(traced, costs, phase, len(edges), len(nodes))
    edge_index = (torch.tensor(list(edges.keys()), dtype=torch.long).t().contiguous()
                  if edges else torch.zeros(2, 0, dtype=torch.long))
    edge_attr = torch.tensor([[_log(b)] for b in edges.values()], dtype=torch.float32).reshape(-1, 1)
    tensors = dict(
        x=torch.tensor(x, dtype=torch.float32).reshape(-1, NODE_FEATURES),
        x_cat=torch.tensor(x_cat, dtype=torch.long).reshape(-1, 4),
        edge_index=edge_index,
        edge_attr=edge_attr,
        u=torch.tensor([graph_features(traced, summary)], dtype=torch.float32),
        phase=torch.tensor(phase, dtype=torch.long),
        grad_bytes=torch.tensor(grad_bytes, dtype=torch.float64),
        fresh_bytes=torch.tensor(fresh, dtype=torch.float64).reshape(-1, 2),
        gemm_layout=torch.tensor(layout, dtype=torch.long),
    )
    return tensors, summary


def _input_pairs(node: torch.fx.Node) -> list[tuple[torch.fx.Node, torch.Tensor]]:
    """(producer node, tensor) for every tensor input, walking the fx args and their values together."""
    pairs = []

    def walk(arg, val):
        if isinstance(arg, torch.fx.Node):
            if isinstance(val, (torch.Tensor, ops.TensorMeta)):
                pairs.append((arg, val))
        elif isinstance(arg, (list, tuple)) and isinstance(val, (list, tuple)):
            for a, v in zip(arg, val):
                walk(a, v)

    args, kwargs = node.meta["in"]
    walk(node.args, args)
    for key, arg in node.kwargs.items():
        walk(arg, kwargs.get(key))
    return pairs


def _summarize(traced: TracedStep, costs: list[ops.OpCost], phase: list[int], n_edges: int,
               n_traced: int) -> StepSummary:
    s = StepSummary(nodes=len(costs), edges=n_edges, traced_nodes=n_traced, params=traced.param_count)
    s.flops_by_phase = {p: 0.0 for p in PHASES}
    s.bytes_by_phase = {p: 0.0 for p in PHASES}
    s.kernels_by_phase = {p: 0 for p in PHASES}
    tc_flops = 0.0
    for cost, ph in zip(costs, phase):
        name = PHASES[ph]
        s.flops_by_phase[name] += cost.flops
        s.bytes_by_phase[name] += cost.bytes_read + cost.bytes_written
        s.kernels_by_phase[name] += 1
        s.flops_by_dtype[cost.dtype] = s.flops_by_dtype.get(cost.dtype, 0.0) + cost.flops
        s.bytes_by_dtype[cost.dtype] = (s.bytes_by_dtype.get(cost.dtype, 0.0)
                                        + cost.bytes_read + cost.bytes_written)
        tc_flops += cost.flops if cost.tensor_core else 0.0
        if cost.op not in ops.OP_ID:
            s.unseen_ops[cost.op] = s.unseen_ops.get(cost.op, 0) + 1
    s.tensor_core_flop_share = tc_flops / s.flops if s.flops else 0.0
    return s


def graph_features(traced: TracedStep, s: StepSummary) -> list[float]:
    cfg = traced.config
    shape = traced.shape
    u = [float(cfg.precision == p) for p in PRECISION_NAMES]
    u += [float(cfg.optimizer == o) for o in OPTIMIZERS]
    u += [_log(shape.batch_size), _log(shape.seq_len or 0), _log(shape.image_size or 0), _log(s.params)]
    u += [_log(s.flops_by_dtype.get(d, 0.0)) for d in FLOP_DTYPES]
    u += [_log(s.flops_by_phase[p]) for p in PHASES]
    u += [_log(s.bytes_by_phase[p]) for p in PHASES]
    u += [_log(s.kernels_by_phase[p]) for p in PHASES]
    u += [s.tensor_core_flop_share]
    assert len(u) == GRAPH_FEATURES
    return u


def _si(x: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.2f} {prefix}{unit}"
    return f"{x:.0f} {unit}"


def summary_dict(traced: TracedStep, s: StepSummary) -> dict:
    cfg = traced.config
    return {
        "spec": cfg.spec.to_dict(),
        "family": traced.family,
        "batch_size": traced.shape.batch_size,
        "seq_len": traced.shape.seq_len,
        "image_size": traced.shape.image_size,
        "precision": cfg.precision,
        "optimizer": cfg.optimizer,
        "target": cfg.target,
        "params": s.params,
        "traced_ops": s.traced_nodes,
        "nodes": s.nodes,
        "edges": s.edges,
        "flops": s.flops,
        "flops_by_phase": s.flops_by_phase,
        "bytes_by_phase": s.bytes_by_phase,
        "kernels_by_phase": s.kernels_by_phase,
        "flops_by_dtype": s.flops_by_dtype,
        "bytes_by_dtype": s.bytes_by_dtype,
        "tensor_core_flop_share": s.tensor_core_flop_share,
        "unseen_ops": s.unseen_ops,
        "trace_s": traced.trace_s,
        "feature_version": feature_version(traced.config.target),
    }


def summary_table(traced: TracedStep, s: StepSummary) -> str:
    cfg = traced.config
    shape = traced.shape
    dims = f"batch {shape.batch_size}" + (f" x seq {shape.seq_len}" if shape.seq_len else "") + (
        f" x {shape.image_size}px" if shape.image_size else "")
    precision = get_precision(cfg.precision)
    lines = [
        f"{cfg.spec}  (family {traced.family})  {dims}",
        f"precision {cfg.precision}: {precision.description}",
        f"optimizer {cfg.optimizer}, target {cfg.target}",
        f"parameters {_si(s.params, '')}   traced ops {s.traced_nodes} -> graph nodes {s.nodes}, "
        f"edges {s.edges}   (traced in {traced.trace_s:.1f} s)",
        "",
        f"{'phase':<10}{'kernels':>9}{'FLOPs':>14}{'bytes':>14}",
    ]
    for p in PHASES:
        lines.append(f"{p:<10}{s.kernels_by_phase[p]:>9}{_si(s.flops_by_phase[p], 'FLOP'):>14}"
                     f"{_si(s.bytes_by_phase[p], 'B'):>14}")
    lines.append(f"{'total':<10}{s.nodes:>9}{_si(s.flops, 'FLOP'):>14}"
                 f"{_si(sum(s.bytes_by_phase.values()), 'B'):>14}")
    lines += ["", f"{'dtype':<10}{'FLOPs':>14}{'share':>9}{'bytes':>14}"]
    for dtype, flops in sorted(s.flops_by_dtype.items(), key=lambda kv: -kv[1]):
        if flops == 0 and s.bytes_by_dtype.get(dtype, 0) == 0:
            continue
        share = flops / s.flops if s.flops else 0.0
        lines.append(f"{dtype:<10}{_si(flops, 'FLOP'):>14}{share:>8.1%}{_si(s.bytes_by_dtype[dtype], 'B'):>14}")
    lines.append(f"\ntensor cores: {s.tensor_core_flop_share:.1%} of FLOPs")
    if s.unseen_ops:
        lines.append("ops outside the vocabulary: " + ", ".join(f"{k} x{v}" for k, v in s.unseen_ops.items()))
    return "\n".join(lines)
