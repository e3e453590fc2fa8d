"""The GNN: per-node kernel times that add up to per-phase step times, plus the step's peak memory.

Each node (one GPU kernel) gets an embedding of its op, category, dtype and phase plus its numeric
features; message passing (GINE, GATv2 or a graph-transformer layer) lets a node see its neighbours
(what feeds it, what it feeds); the graph-level features (precision class, sizes, totals) are added to
every node. With ``readout="node_sum"`` a head gives each node a log-time and the forward, backward and
optimizer times are the (log-)sums over their nodes: a prediction that explains itself op by op.
``readout="pool"`` predicts the three phase times from pooled embeddings instead.
``target="log_ratio_prior"`` makes the head predict each node's (pool: phase's) log-ratio to the physical
prior on the graph's hardware, and ``hardware_descriptor`` adds that hardware's descriptor (its measured or
datasheet ceilings, ``gnn_ptp/descriptor.py``) to the graph-level embedding.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from gnn_ptp import ops
from gnn_ptp.errors import UserError
from gnn_ptp.graph import GRAPH_FEATURES, NODE_FEATURES

LAYERS = ("gine", "gatv2", "transformer")
NORMS = ("layer", "batch", "graph", "none")
READOUTS = ("node_sum", "pool", "queue")
TARGETS = ("log_ms", "log_ratio_prior")
N_PHASES = 3
BEYOND_FACTOR = 2.0
"""How far beyond the largest training step (by FLOPs) a residual model's correction reaches its factor for
larger steps (``StepTimeGNN.beyond_scale``): blended in log FLOPs from the in-range factor at the largest
training step to that factor at twice its FLOPs and beyond; also the inner size split's gap
(``train.inner_size_split``: its check steps have at least twice the FLOPs of its training half's largest).
Declared before any run scored it (README *Protocol*, "A factor for larger steps")."""
TRUST_FADE = math.log(2.0)
"""Width (log ms) over which ``trust_region`` fades a node's correction (a sigmoid): half at the longest
training kernel's prior time, 0.27 at twice it, 0.12 at four times."""


@dataclass(frozen=True)
class ModelConfig:
    layer: str = "gine"
    """Message-passing layer: gine, gatv2 or transformer."""
    hidden: int = 128
    """Width of node embeddings."""
    depth: int = 4
    """Number of message-passing layers."""
    norm: str = "layer"
    """Normalisation after each layer: layer, batch, graph or none."""
    readout: str = "node_sum"
    """node_sum (per-node times summed per phase), pool (pooled embedding -> phase times) or queue (with
    target log_ratio_prior: per-node corrections of each kernel's device time, composed into phase times
    by the prior's launch queue with the host's costs, ``prior.phase_seconds``, and a bounded per-phase
    factor on those host costs from the pooled embedding; ``log_kernel_ms`` holds the corrected device
    times, ``log_node_ms`` their shares of the phase times, as node_sum's)."""
    dropout: float = 0.0
    heads: int = 4
    """Attention heads (gatv2, transformer)."""
    precision_aware: bool = True
    """False builds the precision-unaware baseline: graphs traced as fp32, whatever the precision."""
    prior_feature: str = ""
    """Hardware name (h100, cpu, ...): add the physical prior's per-node log-time (gnn_ptp/prior.py, that
    hardware's calibrated curves) to every node's features. "" (default): off, the model as before."""
    target: str = "log_ms"
    """What the time head predicts: "log_ms" (default), log milliseconds per node (node_sum) or per phase
    (pool); "log_ratio_prior", the log-ratio of that time to the physical prior's estimate on the sample's
    hardware (gnn_ptp/prior.py priced with the hardware's descriptor, gnn_ptp/descriptor.py): the GNN learns
    a correction to a roofline that already scales with the hardware's rates and the step's size."""
    trust_region: bool = False
    """With target log_ratio_prior (readout node_sum or queue): fade each node's correction to nothing for
    kernels longer than any the model was trained on (the prior's device time beyond the training nodes'
    longest, ``trust_log_ms``, by a sigmoid of width ``TRUST_FADE``), so that a step larger than every
    training step is priced by the prior where the GNN has no data. Declared before it was scored."""
    trust_by_category: bool = False
    """With trust_region: each node's boundary is the longest training kernel of its own op category
    (``ops.CATEGORIES``: a convolution against the longest training convolution, a norm against the longest
    norm), not the longest kernel of any kind; a category no training step holds keeps no correction.
    Declared before it was scored (README *Protocol*, "A trust region per kind of kernel")."""
    hardware_descriptor: bool = False
    """Feed the hardware's descriptor (peak GEMM rate per dtype, vector rate, bandwidth, launch floor, GPU
    flag; gnn_ptp/descriptor.py) to the model, added to the graph-level embedding every node sees, so one
    checkpoint can train on several hardware kinds and be asked about one it has not seen."""

    def __post_init__(self):
        for name in ("hidden", "depth", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise UserError(f"model {name} = {value!r} must be an integer")
        for name in ("hardware_descriptor", "trust_region", "trust_by_category"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"model {name} = {getattr(self, name)!r} must be true or false")
        for name, allowed in (("layer", LAYERS), ("norm", NORMS), ("readout", READOUTS), ("target", TARGETS)):
            if getattr(self, name) not in allowed:
                raise UserError(f"model {name} {getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.hidden < 8 or self.depth < 0 or not 0 <= self.dropout < 1:
            raise UserError(f"model config out of range: hidden {self.hidden} (>= 8), depth {self.depth} "
                            f"(>= 0), dropout {self.dropout} (in [0, 1))")
        if self.prior_feature:
            from gnn_ptp.hardware import HARDWARE

            if self.prior_feature not in HARDWARE:
                raise UserError(f"model prior_feature {self.prior_feature!r} is not one of "
                                f"{', '.join(HARDWARE)} (or \"\" for off)")
        if self.trust_region and (self.target != "log_ratio_prior" or self.readout == "pool"):
            raise UserError("model trust_region fades per-node corrections to the prior: it needs target "
                            "\"log_ratio_prior\" and readout \"node_sum\" or \"queue\"")
        if self.trust_by_category and not self.trust_region:
            raise UserError("model trust_by_category sets where trust_region fades corrections: it needs "
                            "trust_region = true")
        if self.readout == "queue" and self.target != "log_ratio_prior":
            raise UserError(f"model readout \"queue\" corrects the prior's kernel times: it needs target "
                            f"\"log_ratio_prior\", not {self.target!r}")
        if self.layer in ("gatv2", "transformer") and self.hidden % self.heads:
            raise UserError(f"hidden {self.hidden} must be divisible by heads {self.heads}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def needs_hardware(self) -> bool:
        """Whether the model reads a hardware descriptor (its features or its prior)."""
        return self.hardware_descriptor or self.target == "log_ratio_prior"


def _norm(kind: str, dim: int) -> nn.Module:
    from torch_geometric.nn import GraphNorm

    return {"layer": lambda: nn.LayerNorm(dim), "batch": lambda: nn.BatchNorm1d(dim),
            "graph": lambda: GraphNorm(dim), "none": nn.Identity}[kind]()


def _conv(cfg: ModelConfig) -> nn.Module:
    from torch_geometric.nn import GATv2Conv, GINEConv, TransformerConv

    h = cfg.hidden
    if cfg.layer == "gine":
        return GINEConv(nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.Linear(h, h)), edge_dim=h)
    if cfg.layer == "gatv2":
        return GATv2Conv(h, h // cfg.heads, heads=cfg.heads, edge_dim=h, add_self_loops=False)
    return TransformerConv(h, h // cfg.heads, heads=cfg.heads, edge_dim=h, root_weight=True)


def scatter_logsumexp(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """log(sum(exp(values))) per group of ``index`` (groups with no member give -inf)."""
    neg_inf = torch.full((size,), -math.inf, dtype=values.dtype, device=values.device)
    top = neg_inf.scatter_reduce(0, index, values, reduce="amax", include_self=True)
    safe_top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    sums = torch.zeros(size, dtype=values.dtype, device=values.device).index_add(
        0, index, torch.exp(values - safe_top[index]))
    return torch.log(sums) + safe_top


class StepTimeGNN(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden
        self.op_embed = nn.Embedding(len(ops.VOCAB), 32)
        self.cat_embed = nn.Embedding(len(ops.CATEGORIES), 8)
        self.dtype_embed = nn.Embedding(len(ops.DTYPES), 8)
        self.phase_embed = nn.Embedding(N_PHASES, 4)
        extra = 1 if cfg.prior_feature else 0  # the prior's log-time, behind a flag (off by default)
        self.node_in = nn.Sequential(nn.Linear(32 + 8 + 8 + 4 + NODE_FEATURES + extra, h), nn.GELU(),
                                     nn.Linear(h, h))
        self.edge_in = nn.Linear(1, h)
        self.graph_in = nn.Sequential(nn.Linear(GRAPH_FEATURES, h), nn.GELU(), nn.Linear(h, h))
        if cfg.hardware_descriptor:
            from gnn_ptp.descriptor import DESCRIPTOR_FEATURES

            self.hw_in = nn.Sequential(nn.Linear(DESCRIPTOR_FEATURES, h), nn.GELU(), nn.Linear(h, h))
        self.correction_scale = 1.0
        """With target log_ratio_prior: the factor on the learnt log-correction to the prior (1: as learnt; 0: the
        prior alone; 0.5: the geometric mean of the two), chosen on the validation families by ``train`` when
        its config asks (``TrainConfig.scale_on_validation``) and restored by ``checkpoint.load`` from
        meta.json. Not a weight: a checkpoint trained before it existed loads with 1."""
        self.beyond_scale = None
        """With target log_ratio_prior: the factor on the correction for steps beyond the training range, chosen by
        ``train`` on an inner size split (``TrainConfig.scale_beyond_range``), None without one: from the largest
        training step's FLOPs (``train_max_flops``) to ``BEYOND_FACTOR`` times them the factor moves in log FLOPs
        from ``correction_scale`` to it. Not a weight: restored by ``checkpoint.load`` from meta.json."""
        self.train_max_flops = None
        """The largest training step's FLOPs (with ``beyond_scale``)."""
        self.descriptor = None
        """The hardware (``descriptor.Descriptor``) of graphs that carry none (``hw``, ``prior_log_ms``):
        the training data's, set by ``train`` and restored by ``checkpoint.load`` from meta.json."""
        self.convs = nn.ModuleList(_conv(cfg) for _ in range(cfg.depth))
        self.norms = nn.ModuleList(_norm(cfg.norm, h) for _ in range(cfg.depth))
        self.drop = nn.Dropout(cfg.dropout)
        self.node_time = nn.Sequential(nn.Linear(2 * h, h), nn.GELU(), nn.Linear(h, 1))
        self.pool_time = nn.Sequential(nn.Linear(3 * h, h), nn.GELU(), nn.Linear(h, N_PHASES))
        self.memory = nn.Sequential(nn.Linear(3 * h, h), nn.GELU(), nn.Linear(h, 1))
        if cfg.readout == "queue":  # log-factor on each phase's host costs, starting at 1
            self.host_scale = nn.Sequential(nn.Linear(3 * h, h), nn.GELU(), nn.Linear(h, N_PHASES))
            nn.init.zeros_(self.host_scale[-1].weight)
            nn.init.zeros_(self.host_scale[-1].bias)
        self.register_buffer("time_offset", torch.zeros(()))
        self.register_buffer("memory_offset", torch.zeros(()))
        if cfg.trust_region:  # one boundary, or one per op category (trust_by_category)
            shape = (len(ops.CATEGORIES),) if cfg.trust_by_category else ()
            self.register_buffer("trust_log_ms", torch.full(shape, math.inf))

    def set_offsets(self, log_time: float, log_nodes: float, log_memory: float) -> None:
        """Start predictions near the data: per-node log-times sum to the mean phase time."""
        self.time_offset.fill_(log_time - (log_nodes if self.cfg.readout == "node_sum" else 0.0))
        self.memory_offset.fill_(log_memory)

    def embed(self, data) -> tuple[torch.Tensor, torch.Tensor]:
        from torch_geometric.nn import GraphNorm

        x_cat, batch = data.x_cat, data.batch
        numeric = [data.x]
        if self.cfg.prior_feature:
            from gnn_ptp import prior

            profile = prior.get_profile(self.cfg.prior_feature)
            numeric.append(prior.log_node_ms({"x": data.x, "x_cat": x_cat, "phase": data.phase,
                                              "grad_bytes": getattr(data, "grad_bytes", None),
                                              "fresh_bytes": getattr(data, "fresh_bytes", None),
                                              "gemm_layout": getattr(data, "gemm_layout", None),
                                              "batch": batch}, profile).to(data.x)[:, None])
        h = self.node_in(torch.cat([self.op_embed(x_cat[:, 0]), self.cat_embed(x_cat[:, 1]),
                                    self.dtype_embed(x_cat[:, 2]), self.phase_embed(x_cat[:, 3]),
                                    *numeric], dim=-1))
        g = self.graph_in(data.u)
        if self.cfg.hardware_descriptor:
            g = g + self.hw_in(self._hardware(data, "hw").to(g))
        h = h + g[batch]
        e = self.edge_in(data.edge_attr)
        for conv, norm in zip(self.convs, self.norms):
            out = conv(h, data.edge_index, e)
            out = norm(out, batch) if isinstance(norm, GraphNorm) else norm(out)
            h = h + self.drop(torch.nn.functional.gelu(out))
        return h, g

    def _hardware(self, data, name: str) -> torch.Tensor:
        """The graphs' hardware features (``hw`` [G, D]), the prior's per-node log ms (``prior_log_ms`` [N]:
        shares of the launch queue; ``prior_device_log_ms`` [N]: device times) or host costs (``host_s``
        [G, HOST_FIELDS]): carried by the data (``descriptor.attach``, ``prior.price``), else those of
        ``self.descriptor``."""
        value = getattr(data, name, None)
        if value is not None:
            return value
        if self.descriptor is None:
            what = "hardware_descriptor" if name == "hw" else f"target {self.cfg.target}, readout {self.cfg.readout}"
            raise UserError(f"this model ({what}) "
                            "needs a hardware descriptor: the graphs carry none and the model has no default")
        if name == "hw":
            return self.descriptor.features().expand(int(data.u.shape[0]), -1)
        from gnn_ptp import prior

        profile = self.descriptor.profile()
        if name == "host_s":
            return prior.host_vector(profile).float().expand(int(data.u.shape[0]), -1)
        if name == "prior_device_log_ms":
            return prior.device_log_ms(data.x, data.x_cat, profile, getattr(data, "fresh_bytes", None),
                                       getattr(data, "gemm_layout", None)).to(data.x)
        return prior.log_node_ms({"x": data.x, "x_cat": data.x_cat, "phase": data.phase,
                                  "grad_bytes": getattr(data, "grad_bytes", None),
                                  "fresh_bytes": getattr(data, "fresh_bytes", None),
                                  "gemm_layout": getattr(data, "gemm_layout", None),
                                  "batch": getattr(data, "batch", None)}, profile).to(data.x)

    def forward(self, data) -> dict[str, torch.Tensor]:
        """Returns ``log_phase_ms`` [G, 3] (forward, backward, optimizer), ``log_memory`` [G] and, for
        node_sum, ``log_node_ms`` [N]."""
        from torch_geometric.nn import global_max_pool, global_mean_pool

        h, g = self.embed(data)
        n_graphs = g.shape[0]
        pooled = torch.cat([global_mean_pool(h, data.batch, n_graphs), global_max_pool(h, data.batch, n_graphs),
                            g], dim=-1)
        out = {"log_memory": self.memory(pooled).squeeze(-1) + self.memory_offset}
        if self.cfg.readout == "queue":
            device = self._hardware(data, "prior_device_log_ms")
            factor = self.factors(data)
            log_node = self._scaled(self._trusted(self.node_time(torch.cat([h, g[data.batch]], dim=-1)).squeeze(-1)
                                                  + self.time_offset, device, data.x_cat), factor, data.batch) + device
            out["log_kernel_ms"] = log_node
            out["log_phase_ms"] = self._queued(data, log_node,
                                               torch.exp(self._scaled(torch.tanh(self.host_scale(pooled)), factor)))
            # per-node times that add up to their phase, as node_sum's do (what explain and the DDP overlap
            # read): each kernel's device time scaled to its phase of the queue
            group = data.batch * N_PHASES + data.phase
            device_phase = scatter_logsumexp(log_node, group, out["log_phase_ms"].numel())
            out["log_node_ms"] = log_node - device_phase[group] + out["log_phase_ms"].reshape(-1)[group]
            return out
        if self.cfg.readout == "node_sum":
            log_node = self.node_time(torch.cat([h, g[data.batch]], dim=-1)).squeeze(-1) + self.time_offset
            if self.cfg.target == "log_ratio_prior":
                if self.cfg.trust_region:
                    log_node = self._trusted(log_node, self._hardware(data, "prior_device_log_ms"), data.x_cat)
                log_node = self._scaled(log_node, self.factors(data), data.batch) + self._hardware(data, "prior_log_ms")
            group = data.batch * N_PHASES + data.phase
            phase = scatter_logsumexp(log_node, group, n_graphs * N_PHASES).view(n_graphs, N_PHASES)
            out["log_node_ms"] = log_node
        else:
            phase = self.pool_time(pooled) + self.time_offset
            if self.cfg.target == "log_ratio_prior":
                group = data.batch * N_PHASES + data.phase
                prior_phase = scatter_logsumexp(self._hardware(data, "prior_log_ms"), group,
                                                n_graphs * N_PHASES).view(n_graphs, N_PHASES)
                phase = self._scaled(phase, self.factors(data)) + torch.where(torch.isfinite(prior_phase), prior_phase,
                                                          torch.zeros_like(prior_phase))
        out["log_phase_ms"] = phase
        return out

    def factors(self, data) -> float | torch.Tensor:
        """The factor on each graph's correction to the prior: ``correction_scale``, or with ``beyond_scale`` a
        [G] tensor moving from it to ``beyond_scale`` as the graph's step FLOPs go from ``train_max_flops`` to
        ``BEYOND_FACTOR`` times them (linear in log FLOPs)."""
        if self.beyond_scale is None:
            return self.correction_scale
        batch = getattr(data, "batch", None)
        batch = torch.zeros(data.x.shape[0], dtype=torch.long) if batch is None else batch
        flops = torch.zeros(int(data.u.shape[0]), dtype=torch.float64).index_add(0, batch, node_flops(data.x))
        w = beyond_reach(flops, self.train_max_flops)
        return (self.correction_scale + w * (self.beyond_scale - self.correction_scale)).to(data.x.dtype)

    @staticmethod
    def _scaled(correction: torch.Tensor, factor: float | torch.Tensor, batch=None) -> torch.Tensor:
        """A log-correction to the prior times ``factor`` (``factors``: one number, or one per graph, indexed by
        ``batch`` for per-node corrections); untouched at 1."""
        if not isinstance(factor, torch.Tensor):
            return correction if factor == 1.0 else correction * factor
        if correction.dim() == 1:  # per node
            return correction * factor[batch if batch is not None else torch.zeros_like(correction, dtype=torch.long)]
        return correction * factor[:, None]

    def _trusted(self, correction: torch.Tensor, prior_device_log_ms: torch.Tensor,
                 x_cat: torch.Tensor) -> torch.Tensor:
        """``correction`` (per-node log-ratio to the prior) faded beyond the longest training kernel, or the
        longest of the node's op category (``x_cat[:, 1]``) with ``trust_by_category`` (``trust_region``);
        unchanged without it."""
        if not self.cfg.trust_region:
            return correction
        boundary = self.trust_log_ms[x_cat[:, 1]] if self.cfg.trust_by_category else self.trust_log_ms
        return correction * torch.sigmoid((boundary - prior_device_log_ms) / TRUST_FADE)

    def _queued(self, data, log_node_ms: torch.Tensor, host_scale: torch.Tensor) -> torch.Tensor:
        """[G, 3] log phase ms: each graph's corrected kernel times through the prior's launch queue
        (``prior.phase_seconds``), its host costs scaled by ``host_scale`` [G, 3]."""
        from gnn_ptp import prior

        host = self._hardware(data, "host_s")
        seconds = torch.exp(log_node_ms.double()) * 1e-3
        batch = data.batch if getattr(data, "batch", None) is not None else torch.zeros_like(data.phase)
        grad_bytes = getattr(data, "grad_bytes", None)
        phases = []
        for g in range(int(host.shape[0])):
            on = batch == g
            phases.append(prior.phase_seconds(
                seconds[on], data.phase[on], host[g].double(),
                prior.param_tensors(grad_bytes[on] if grad_bytes is not None else None), host_scale[g].double()))
        return torch.log(torch.stack(phases) * 1e3).to(log_node_ms.dtype)


def node_flops(x: torch.Tensor) -> torch.Tensor:
    """Each node's FLOPs (float64) from its features (node feature 0 is log2(1 + FLOPs))."""
    return torch.exp2(x[:, 0].double()) - 1


def beyond_reach(flops: torch.Tensor, train_max_flops: float) -> torch.Tensor:
    """How far (0 to 1) steps of ``flops`` are along the move to the factor for larger steps: 0 up to the largest
    training step, linear in log FLOPs, 1 from ``BEYOND_FACTOR`` times it."""
    top = max(float(train_max_flops), 1.0)
    return (torch.log(flops.clamp_min(1.0) / top) / math.log(BEYOND_FACTOR)).clamp(0.0, 1.0)


def log_total(log_phase_ms: torch.Tensor) -> torch.Tensor:
    """log(forward + backward + optimizer) from per-phase log times; empty phases (-inf) add nothing."""
    return torch.logsumexp(log_phase_ms, dim=-1)


class SeedEnsemble(nn.Module):
    """Several ``StepTimeGNN`` of one config trained with different seeds (``TrainConfig.ensemble_seeds``: each
    its own initialisation, batches and, unless the config names them, validation families; each its own factor
    on its correction), answering as one model: each graph's step at the geometric mean of the members' step
    times, split into phases by the geometric means of the members' phase times, each phase into nodes by the
    geometric means of their node times (so node times still add up to their phase, as ``explain`` and the DDP
    overlap read them), and its peak memory at the geometric mean of theirs. Declared before a run not yet seen
    scored it (README *Protocol*, "A seed ensemble"; ``protocol.ENSEMBLED`` scores the same step times)."""

    def __init__(self, members: list[StepTimeGNN]):
        super().__init__()
        if len(members) < 2 or any(m.cfg != members[0].cfg for m in members):
            raise ValueError("an ensemble needs two members or more of one model config")
        self.members = nn.ModuleList(members)
        self.cfg = members[0].cfg
        self.descriptor = members[0].descriptor
        """What every member assumes of graphs that carry no hardware (``StepTimeGNN.descriptor``): set on the
        ensemble (``predict --cpu-kind`` sets it on a copy), lent to the members for each forward."""
        self.correction_scale = 1.0
        """No factor of its own: each member's correction is scaled by its own (``members[i].correction_scale``)."""

    def forward(self, data) -> dict[str, torch.Tensor]:
        outs = []
        for m in self.members:
            kept, m.descriptor = m.descriptor, self.descriptor
            try:
                outs.append(m(data))
            finally:
                m.descriptor = kept
        log_phase = torch.stack([o["log_phase_ms"] for o in outs]).mean(0)
        log_step = torch.stack([log_total(o["log_phase_ms"]) for o in outs]).mean(0)
        total = log_total(log_phase)
        log_phase = log_phase + torch.where(torch.isfinite(total), log_step - total, torch.zeros_like(total))[:, None]
        out = {"log_phase_ms": log_phase, "log_memory": torch.stack([o["log_memory"] for o in outs]).mean(0)}
        if all("log_node_ms" in o for o in outs):
            nodes = torch.stack([o["log_node_ms"] for o in outs]).mean(0)
            batch = data.batch if getattr(data, "batch", None) is not None else torch.zeros_like(data.phase)
            group = batch * N_PHASES + data.phase
            share = scatter_logsumexp(nodes, group, log_phase.numel())
            out["log_node_ms"] = nodes - share[group] + log_phase.reshape(-1)[group]
        return out
