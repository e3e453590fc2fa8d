"""The Python API: ``gnn_ptp.predict(spec, precision=..., batch_size=..., gpus=...)`` -> ``Prediction``.

Schedulers and notebooks call this directly; ``gnn-ptp predict`` is a thin layer over it. A traced
graph is cached in memory and on disk (``~/.cache/gnn-ptp``, keyed by the step config, its target's
feature version and library versions), so asking again, or for another GPU count, does not trace again;
tf32 and torch-default reuse the fp32 trace; several precisions are traced in parallel processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gnn_ptp import graph as graph_mod
from gnn_ptp import ops
from gnn_ptp.errors import UserError, closest
from gnn_ptp.precision import PRECISION_NAMES, get_precision
from gnn_ptp.spec import Shape, parse_spec
from gnn_ptp.store import from_bytes, to_bytes
from gnn_ptp.trace import StepConfig, shared_trace

_DATA_FIELDS = ("x", "x_cat", "edge_index", "edge_attr", "u", "phase", "grad_bytes", "fresh_bytes", "gemm_layout")
MEMORY_VERSION = 1
"""Bump when gnn_ptp/memory.py changes what it counts: cached graphs carry its estimate."""


@dataclass
class Prediction:
    """One predicted training step (and, when asked, the whole job). Times in milliseconds."""

    spec: str
    precision: str
    batch_size: int
    """Samples per step per GPU."""
    seq_len: int | None
    image_size: int | None
    optimizer: str
    gpus: int
    hardware: str
    forward_ms: float
    """One micro-batch's forward pass (with --grad-accum k there are k per step)."""
    backward_ms: float
    """One micro-batch's backward pass."""
    optimizer_ms: float
    compute_ms: float
    """k x (forward + backward) + optimizer on one GPU (k = grad_accum), times compute_slowdown."""
    comm_exposed_ms: float
    """DDP all-reduce time not hidden behind the last backward pass (gnn_ptp/comm.py; 0 for one GPU)."""
    iteration_ms: float
    """compute_ms + comm_exposed_ms: one optimizer step of the whole data-parallel job."""
    comm_total_ms: float = 0.0
    """All DDP all-reduce time of the step, hidden or not."""
    allreduce_buckets: int = 0
    """DDP gradient buckets (1 MiB first, then bucket_cap_mb), one all-reduce each."""
    fabric: str = ""
    """The all-reduce fit used (nvlink, infiniband, ...); '' for one GPU or no model."""
    nodes: int = 1
    interconnect: str = ""
    """The interconnect profile (h100-nvswitch, h100-ib-ndr400, cpu-gloo or a calibrated file's name)."""
    grad_accum: int = 1
    global_batch_size: int = 0
    """batch_size x gpus x grad_accum: samples per optimizer step."""
    scaling_efficiency: float = 1.0
    """One GPU's time for its share of the step over the data-parallel iteration time (1.0: perfect)."""
    compute_slowdown: float = 1.0
    """> 1 where ranks share a node's compute (a CPU with more ranks than cores)."""
    peak_memory_bytes: float | None = None
    """Peak allocated bytes of the step, from the traced graph (gnn_ptp/memory.py): what
    ``torch.cuda.max_memory_allocated`` reports on a GPU, live tensor bytes on a CPU."""
    fits_in_memory: bool | None = None
    """The allocator's segments + the CUDA context fit in the hardware's memory."""
    memory: dict = field(default_factory=dict)
    """The whole memory estimate: floor (weights + gradients + optimizer state), peak per phase, what is
    live at the peak, reserved and device bytes (``memory.MemoryEstimate.to_dict()``)."""
    params: int = 0
    flops: float = 0.0
    steps: int | None = None
    total_s: float | None = None
    gpu_hours: float | None = None
    cost: float | None = None
    overrides: dict = field(default_factory=dict)
    checkpoint: str = ""
    top_ops: list[dict] = field(default_factory=list)
    """Where the time goes: the ops with the largest summed predicted time."""
    op_breakdown: list[dict] = field(default_factory=list)
    """Every op's predicted ms per phase, in all, and its share of the step, largest first (``--explain``;
    gnn_ptp/explain.py)."""
    warnings: list[str] = field(default_factory=list)
    source: str = "checkpoint"
    """"checkpoint" (a trained GNN) or "analytic-prior" (no checkpoint for this hardware yet: the
    calibrated physical prior of gnn_ptp/prior.py alone)."""
    expected_error: dict = field(default_factory=dict)
    """The expected error of the step time and how it was derived: for an analytic-prior prediction its
    section's, each family left out of the fit (``prior.model_error``); for a checkpoint's, the MAPE its
    training measured on the families it held out (``checkpoint_error``), with this model's family's
    place (``this_model``)."""
    parallel: str = "ddp"
    """How the GPUs share the model: ddp (replicated), fsdp (FSDP2 full sharding, ZeRO-3) or
    fsdp-no-reshard (ZeRO-2-like); for --parallel auto, the mode it chose."""
    memory_per_gpu_bytes: float | None = None
    """Peak allocated bytes on one GPU under ``parallel`` (sharded floor + working set under FSDP)."""
    parallel_options: list[dict] = field(default_factory=list)
    """Under --parallel auto: every mode's iteration_ms, memory per GPU, device bytes and fit."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --- checkpoints -----------------------------------------------------------------------------------


def default_checkpoint(hardware: str) -> Path:
    """``$GNN_PTP_CHECKPOINTS/<hw>``, else ``checkpoints/<hw>`` beside the package, else in the cwd."""
    candidates = []
    if os.environ.get("GNN_PTP_CHECKPOINTS"):
        candidates.append(Path(os.environ["GNN_PTP_CHECKPOINTS"]) / hardware)
    candidates += [Path(__file__).resolve().parent.parent / "checkpoints" / hardware,
                   Path.cwd() / "checkpoints" / hardware]
    for path in candidates:
        if (path / "meta.json").is_file():
            return path
    shipped = sorted(p.parent.name for c in candidates for p in c.parent.glob("*/meta.json"))
    raise UserError(f"no {hardware} checkpoint is shipped yet (looked in {candidates[-2].parent}); "
                    f"shipped: {', '.join(sorted(set(shipped))) or 'none'} -- use --hardware with one of "
                    f"them or --checkpoint PATH"
                    + (f"; did you mean {hardware.lower()!r}?" if hardware.lower() in shipped and hardware != hardware.lower()
                       else closest(hardware, set(shipped))))


_MODELS: dict[tuple, tuple] = {}


def _load_checkpoint(path: Path):
    from gnn_ptp import checkpoint

    weights = path / "model.pt"
    key = (str(path.resolve()), weights.stat().st_mtime_ns if weights.exists() else 0)  # retrained: reload
    if key not in _MODELS:
        _MODELS[key] = checkpoint.load(path)
    return _MODELS[key]


# --- graphs, cached --------------------------------------------------------------------------------


def _cache_dir() -> Path:
    return Path(os.environ.get("GNN_PTP_CACHE", Path.home() / ".cache" / "gnn-ptp")) / "graphs"


def _graph_key(config: StepConfig) -> str:
    import transformers

    payload = {"spec": config.spec.to_dict(), "shape": dataclasses.asdict(config.shape),
               "precision": config.precision, "optimizer": config.optimizer, "target": config.target,
               "kernels": config.kernels,
               "feature_version": graph_mod.feature_version(config.target), "memory_version": MEMORY_VERSION,
               "layout_version": graph_mod.LAYOUT_VERSION,
               "torch": torch.__version__,
               "transformers": transformers.__version__}
    if config.target == "cuda":  # only CUDA graphs follow cuda_dispatch's kernel choices: CPU keys stay as they were
        from gnn_ptp.cuda_dispatch import DISPATCH_VERSION

        payload["dispatch_version"] = DISPATCH_VERSION
    return hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _build_graph(config: StepConfig, kernel_nodes: bool = False) -> tuple[dict, dict]:
    """Graph tensors and summary info of one traced step; with ``kernel_nodes``, the info also holds the
    trace's ``match.kernel_nodes`` (what matching a profile onto it needs: ``node_labels``)."""
    from gnn_ptp import memory
    from gnn_ptp.trace import trace_step

    traced = trace_step(config)
    tensors, summary = graph_mod.to_tensors(traced)
    info = {"summary": dataclasses.asdict(summary), "family": traced.family, "param_count": traced.param_count,
            "shape": dataclasses.asdict(traced.shape), "memory": memory.estimate(traced).to_dict()}
    if kernel_nodes:
        from gnn_ptp import match

        info["kernel_nodes"] = match.kernel_nodes(traced)
    return {k: tensors[k] for k in _DATA_FIELDS}, info


def _graphs(configs: list[StepConfig], use_disk_cache: bool = True) -> list[tuple[dict, dict]]:
    """Graph tensors + summary for each config: memory, then disk cache, then traced (in parallel)."""
    from gnn_ptp.store import atomic_torch_save

    results: dict[int, tuple] = {}
    todo = []
    for i, config in enumerate(configs):
        path = _cache_dir() / f"{_graph_key(config)}.pt"
        if use_disk_cache and path.is_file():
            try:
                cached = torch.load(path, weights_only=True)
                results[i] = (cached["tensors"], json.loads(cached["info"]))
                continue
            except Exception:  # an unreadable cache entry is rebuilt, never trusted
                pass
        todo.append(i)
    # tf32 / torch-default share the fp32 trace: each group is traced once, converted per precision
    groups: dict[StepConfig, list[int]] = {}
    for i in todo:
        groups.setdefault(shared_trace(configs[i]), []).append(i)
    built = _trace_groups([[configs[i] for i in idx] for idx in groups.values()])
    for idx, group_results in zip(groups.values(), built):
        for i, result in zip(idx, group_results):
            results[i] = result
            if use_disk_cache:
                try:
                    atomic_torch_save({"tensors": result[0], "info": json.dumps(result[1])},
                                      _cache_dir() / f"{_graph_key(configs[i])}.pt")
                except OSError:
                    pass  # a read-only home is no reason to fail a prediction
    return [results[i] for i in range(len(configs))]


def _build_group(configs: list[StepConfig]) -> list[tuple[dict, dict]]:
    return [_build_graph(c) for c in configs]


def _build_group_bytes(configs: list[StepConfig]) -> bytes:
    """For a forked worker: results as bytes, not tensors shared through file descriptors."""
    return to_bytes(_build_group(configs))


def _trace_groups(groups: list[list[StepConfig]]) -> list[list[tuple[dict, dict]]]:
    workers = min(len(groups), os.cpu_count() or 1)
    if workers <= 1 or sys.platform != "linux":
        return [_build_group(g) for g in groups]
    import multiprocessing

    # fork after the imports: each child traces its precision classes without paying for them again
    try:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_single_threaded) as pool:
            return [from_bytes(b) for b in pool.map(_build_group_bytes, groups, chunksize=1)]
    except Exception as e:
        if not _fork_refused(e):
            raise
        return [_build_group(g) for g in groups]  # this process ran autograd before: trace here


def _fork_refused(e: BaseException) -> bool:
    """A forked child cannot run autograd once the parent has (its engine threads do not survive fork):
    the trace then happens in this process instead."""
    while e is not None:
        if "Autograd-and-Fork" in str(e) or "autograd's threading" in str(e):
            return True
        e = e.__cause__
    return False


def _single_threaded() -> None:
    """In a forked worker: OpenMP's thread team does not survive fork() (a parallel region, such as the
    copy that sends a tensor back, would wait forever on it), so the worker runs torch on one thread."""
    torch.set_num_threads(1)


# --- prediction ------------------------------------------------------------------------------------


def _ood_warnings(u: torch.Tensor, data, meta: dict) -> list[str]:
    notes = []
    ranges = meta.get("train_ranges") or {}
    if "u_max" in ranges:
        names = graph_mod.GRAPH_FEATURE_NAMES
        for i, name in enumerate(names):
            if not name.startswith("log_"):
                continue
            value, lo, hi = float(u[0, i]), ranges["u_min"][i], ranges["u_max"][i]
            if value > hi + 1.0 or (value < lo - 1.0 and value > 0):  # log2 units: beyond 2x the range
                # the features are log2(1 + x) (graph._log): back to x, so 512 reads 512, not 513
                notes.append(f"{name[4:]} is {_unlog(value):.3g}, outside the training range "
                             f"[{_unlog(lo):.3g}, {_unlog(hi):.3g}]: extrapolating")
    seen = set(ranges.get("op_ids", []))
    unseen = sorted({ops.VOCAB[i] if i else "<unseen>" for i in data["x_cat"][:, 0].tolist()} -
                    {ops.VOCAB[i] for i in seen})
    if unseen:
        notes.append(f"ops the checkpoint never saw in training: {', '.join(unseen)}")
    return notes


def _prior_step_ms(graphs: list[dict], outside: list[int], hardware: str, grad_accum: int,
                   cpu_kind: str | None = None) -> dict[int, float]:
    """Per graph index of ``outside`` (those beyond the checkpoint's training range, ``_ood_warnings``), the
    calibrated prior's one-device step time for it, the number ``predict --analytic`` gives
    (``prior.analytic_model``; on a CPU ``_cpu_analytic``, of ``cpu_kind`` or the reference CPU, the kind
    the shipped checkpoint was trained on): a user then sees both answers where the checkpoint
    extrapolates. Empty for hardware without a calibrated prior."""
    from gnn_ptp.prior import analytic_model

    if not outside:
        return {}
    if hardware == "cpu":
        found = _cpu_analytic(cpu_kind)[1:]
    else:
        found = analytic_model(hardware)
    if found is None:
        return {}
    with torch.no_grad():
        out = found[0](_batch([graphs[i] for i in outside], analytic=True))
    phases = out["log_phase_ms"].exp().tolist()
    return {i: grad_accum * (fwd + bwd) + opt for i, (fwd, bwd, opt) in zip(outside, phases)}


def _checkpoint_cpu_kind(model) -> str | None:
    """The stored CPU kind a CPU checkpoint was trained on, where it is not the reference CPU (``--analytic``'s
    default): its prior is the one its answer should stand beside; None for the reference CPU, a checkpoint
    without a descriptor or a kind with no stored descriptor."""
    from gnn_ptp import descriptor

    name = getattr(getattr(model, "descriptor", None), "name", None)
    if name is None or name == descriptor.calibrated_descriptor("cpu").name:
        return None
    return name if name in descriptor.stored_cpus() else None


SIZE_PROTOCOL_ERROR = {
    "cpu": ("steps measured apart beyond the range checkpoints/cpu was trained on (up to 2.2x its largest) were "
            "5.2 and 6.8 % off on two held-back sets (33 and 36 steps; the prior alone 6.0 and 5.5 %); steps "
            "4.9-40x larger than any a residual checkpoint of its form was trained on 11.3 and 15.6 % off, the "
            "prior alone 8.8 and 11.1 % (size protocol on the first CPU kind's sixth and seventh held-back sets, "
            "README *Protocol*)"),
    "h200": ("steps 4x larger and more than any a residual checkpoint was trained on were 25.3 % off, the "
             "prior alone 19.9 % (size protocol on the H200's 2,960 configurations, README *Protocol*)")}
"""What the size protocol measured beyond the training range, by checkpoint hardware: quoted where a
prediction is outside its checkpoint's range (``checkpoint_error``)."""


def checkpoint_error(meta: dict, family: str | None, outside: bool = False, other_kind: bool = False) -> dict:
    """A checkpoint's expected step-time error, from what its training measured on the families it held out
    (``meta["metrics"]["test"]``), and what that says for a model of ``family``: its own held-out figure,
    or that its family was trained on (the held-out figure is then the one for an unseen family, an upper
    reading), or that its family is new to the checkpoint. ``outside``: the step is beyond the checkpoint's
    training range (``_ood_warnings``), where that figure was not measured: said so, with the size
    protocol's figures for the hardware (``SIZE_PROTOCOL_ERROR``). ``other_kind``: predicting for another CPU
    kind than the one it was trained on (``--cpu-kind``): said so. Empty where the checkpoint stored no test
    metrics (one trained without held-out families)."""
    test = (meta.get("metrics") or {}).get("test") or {}
    overall, per = test.get("overall") or {}, test.get("per_family") or {}
    if not overall.get("n"):
        return {}
    families = ", ".join(f"{f} {per[f]['mape']:.0f} %" for f in sorted(per))
    summary = (f"{overall['mape']:.0f} % step MAPE (median {overall.get('median_ape', float('nan')):.0f} %) on "
               f"{overall['n']} measured steps of families the checkpoint never saw ({families})")
    err = {"summary": summary, "held_out": {"mape": overall["mape"], "n": overall["n"],
                                              "per_family": {f: per[f]["mape"] for f in sorted(per)}}}
    from gnn_ptp.checkpoint import correction_scale, ensemble_note, scale_note, scale_source, trained_labels
    from gnn_ptp.dataset import label_note

    labels = trained_labels(meta)
    if labels != "mean":  # what it was trained to answer: an uncontended step, not a contended host's mean
        err["labels"] = labels
        err["summary"] += f", {label_note(labels)}"
    scale = correction_scale(meta)
    if scale != 1.0:  # the figure above is the scaled model's: say what answers
        err["correction_scale"] = scale
        err["summary"] += f"; {scale_note(scale, scale_source(meta))}" + (" (the prior alone)" if scale == 0 else "")
    members = ensemble_note(meta)
    if members:  # the figure above is the ensemble's: say what answers
        err["ensemble"] = len(meta["ensemble"]["members"])
        err["summary"] += f"; {members}"
    if family:
        role = (meta.get("split") or {}).get(family)
        if family in per:
            text = f"{family}, a family held out of its training: {per[family]['mape']:.0f} % on its {per[family]['n']} steps"
        elif role in ("train", "val"):
            text = (f"{family}, a family it was {'trained' if role == 'train' else 'validated'} on (other "
                    "configurations of it): the held-out figure is an unseen family's")
        else:
            text = f"{family}, a family new to the checkpoint: the held-out figure applies"
        err["this_model"] = {"family": family, "split": role or "new", "text": text}
    if other_kind:
        err["other_hardware"] = True
        err["summary"] += ("; measured on the CPU kind it was trained on, not the one predicted for (the note "
                           "on moving it)")
    if outside:
        err["outside_training_range"] = True
        size = SIZE_PROTOCOL_ERROR.get(meta.get("hardware"))
        err["summary"] += ("; measured inside its training range, and this step is outside it (the warnings)"
                           + (f": {size}" if size else ""))
    return err


def _beyond_step_note(meta: dict, tensors) -> str | None:
    """For a step with more FLOPs than the checkpoint's largest training step, where the checkpoint has a factor
    for larger steps (``TrainConfig.scale_beyond_range``): how far beyond it is and what factor answers; else None."""
    from gnn_ptp.checkpoint import beyond_note, model_records
    from gnn_ptp.model import beyond_reach, node_flops

    tops = [(r.get("beyond_scale") or {}).get("train_max_flops") for r in model_records(meta)]
    if any(t is None for t in tops):
        return None
    flops = node_flops(tensors["x"]).sum()
    if flops <= min(tops):
        return None
    reach = float(beyond_reach(flops, min(tops)))
    flops = float(flops)
    return (f"this step has {flops / min(tops):.3g}x the FLOPs of the checkpoint's largest training step: "
            f"{beyond_note(meta)}; for this step the move is {reach:.0%} complete"
            + (" for the member with the smallest training range" if len(set(tops)) > 1 else ""))


def _unlog(value: float) -> float:
    """The inverse of ``graph._log``: log2(1 + x) -> x."""
    return max(2.0 ** value - 1.0, 0.0)


def _top_ops(log_node_ms: torch.Tensor, data, k: int = 5) -> list[dict]:
    per_op: dict[str, float] = {}
    for op_id, ms in zip(data["x_cat"][:, 0].tolist(), log_node_ms.exp().tolist()):
        per_op[ops.VOCAB[op_id]] = per_op.get(ops.VOCAB[op_id], 0.0) + ms
    return [{"op": op, "ms": ms} for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1])[:k]]


PARALLEL_MODES = ("ddp", "fsdp", "fsdp-no-reshard", "auto")


@dataclass
class DataParallel:
    """How the step is spread: data-parallel ranks, nodes, interconnect, DDP settings."""

    gpus: int = 1
    nodes: int | None = None
    interconnect: str | None = None
    """Profile name or file; None: the hardware's default."""
    bucket_cap_mb: float = 25.0
    grad_accum: int = 1
    grad_compression: str = "none"
    """none, fp16 or bf16: DDP's fp16/bf16 compress hook all-reduces fp32 gradients at half the bytes."""
    parallel: str = "ddp"
    """ddp, fsdp, fsdp-no-reshard, or auto (the fastest of them that fits in memory)."""

    def validate(self) -> None:
        if self.parallel not in PARALLEL_MODES:
            raise UserError(f"--parallel {self.parallel!r}: one of {', '.join(PARALLEL_MODES)}")
        if self.parallel.startswith("fsdp") and self.gpus < 2:
            raise UserError(f"--parallel {self.parallel} shards over ranks: give --gpus 2 or more")
        if self.parallel.startswith("fsdp") and self.grad_compression != "none":
            raise UserError(f"--grad-compression is a DDP communication hook: not with --parallel {self.parallel}")
        if self.gpus < 1:
            raise UserError(f"--gpus must be at least 1, got {self.gpus}")
        if self.grad_accum < 1:
            raise UserError(f"--grad-accum must be at least 1, got {self.grad_accum}")
        if not self.bucket_cap_mb > 0:
            raise UserError(f"--bucket-cap-mb must be positive, got {self.bucket_cap_mb}")
        if self.grad_compression not in ("none", "fp16", "bf16"):
            raise UserError(f"--grad-compression {self.grad_compression!r}: none, fp16 or bf16")


def _interconnect(hardware: str, dp: DataParallel):
    from gnn_ptp import interconnect

    if dp.interconnect:
        return interconnect.load(dp.interconnect)
    return interconnect.default_for(hardware, dp.gpus, dp.nodes)


def _allreduce(profile, dp: DataParallel, tensors: dict, log_node_ms: torch.Tensor | None, backward_ms: float,
               param_dtype_bytes: int, slowdown: float = 1.0):
    """DDP's all-reduce for ``gpus`` > 1 (gnn_ptp/comm.py) from the GNN's per-kernel backward times (a
    ``pool`` checkpoint has none: gradients then become ready uniformly over ``backward_ms``), and the
    notes a user should read. None where there is one GPU."""
    from gnn_ptp import comm

    if dp.gpus == 1:
        return None, []
    fabric = profile.level(dp.gpus, dp.nodes)
    node_ms = None if log_node_ms is None else (log_node_ms.double().exp() * slowdown).tolist()
    # a compression hook halves fp32 gradients; half-precision gradients (pure bf16) stay as they are
    grad_scale = 0.5 if dp.grad_compression != "none" and param_dtype_bytes == 4 else 1.0
    ddp = comm.ddp_step_comm(tensors["phase"].tolist(), tensors["grad_bytes"].tolist(), fabric, dp.gpus,
                             node_ms=node_ms, backward_ms=backward_ms * slowdown,
                             bucket_cap_bytes=dp.bucket_cap_mb * 1024 * 1024, overlap=profile.overlap,
                             grad_scale=grad_scale)
    copy_ms = profile.bucket_copy_ms(float(tensors["grad_bytes"].sum()), dp.gpus, dp.nodes)
    if copy_ms:  # on the compute thread after the backward's last gradient (CPU ranks)
        ddp.exposed_ms += copy_ms
        ddp.total_ms += copy_ms
    notes = []
    if not fabric.is_measured(dp.gpus):
        notes.append(f"{dp.gpus} GPUs: all-reduce times extrapolated from {fabric.measured_gpus}-rank "
                     f"{fabric.name} measurements (latency ~ log2 ranks, bus bandwidth held constant)")
    return ddp, notes


def _fsdp_blocks(parsed, shape: Shape, precision: str):
    """How FSDP would wrap the model (gnn_ptp/fsdp.find_blocks), from the model built on meta."""
    from gnn_ptp.fsdp import find_blocks
    from gnn_ptp.spec import build

    if parsed not in _BLOCKS:  # the blocks' parameter counts depend on neither shape nor dtype
        workload = build(parsed, shape, "meta", get_precision(precision).param_dtype)
        _BLOCKS[parsed] = find_blocks(workload.model)
    return _BLOCKS[parsed]


_BLOCKS: dict = {}


def _fsdp(profile, dp: DataParallel, mode: str, fwd: float, bwd: float, opt: float, blocks, param_bytes: int):
    """FSDP's step (gnn_ptp/fsdp.py) over the profile: its measured all-gathers and reduce-scatters where
    it has them (``Interconnect.collective_us``), else derived from its all-reduce lines."""
    from gnn_ptp import fsdp

    step = fsdp.fsdp_step(fwd, bwd, opt, blocks, profile.level(dp.gpus, dp.nodes), dp.gpus, param_bytes=param_bytes,
                          mode=mode, overlap=profile.overlap,
                          copy_ms=lambda nbytes: profile.bucket_copy_ms(nbytes, dp.gpus, dp.nodes),  # 0 on GPUs
                          collective=lambda kind, nbytes: profile.collective_us(kind, nbytes, dp.gpus, dp.nodes)[0],
                          overheads=profile.fsdp_overheads(dp.gpus, dp.nodes))
    if dp.grad_accum > 1:  # each micro-step gathers and reduce-scatters again (FSDP2's default); one optimizer
        opt_sharded = opt / dp.gpus
        more = dp.grad_accum - 1
        iteration = step.iteration_ms + more * (step.iteration_ms - opt_sharded)
        compute = step.compute_ms + more * (fwd + bwd)
        step = dataclasses.replace(step, compute_ms=compute, exposed_ms=iteration - compute, iteration_ms=iteration,
                                   allgather_ms=step.allgather_ms * dp.grad_accum,
                                   reduce_scatter_ms=step.reduce_scatter_ms * dp.grad_accum)
    return step


def _fsdp_memory(estimate: dict, blocks, gpus: int, param_bytes: int, mode: str) -> dict:
    """Per-GPU peak (allocated) and device bytes under FSDP: the single-GPU estimate's floor sharded, its
    activations and transients kept, the unsharded blocks in flight added (fsdp.memory_per_rank)."""
    from gnn_ptp import fsdp

    if not estimate:
        return {"memory_per_gpu_bytes": None, "device_bytes": None}
    floor = float(estimate["floor_bytes"])
    activations, optimizer = fsdp.split_estimate(estimate["peak_by_phase"], floor)
    peak = fsdp.memory_per_rank(floor, activations, blocks, gpus, param_bytes, mode, optimizer)
    slack = float(estimate["reserved_bytes"]) - float(estimate["peak_bytes"])
    return {"memory_per_gpu_bytes": peak, "device_bytes": peak + max(0.0, slack) + float(estimate["context_bytes"])}


def _choose(options: list[dict]) -> dict:
    """The fastest option that fits (unknown capacity counts as fitting); where none fits, the smallest."""
    fitting = [o for o in options if o["fits"] is not False]
    if fitting:
        return min(fitting, key=lambda o: o["iteration_ms"])
    return min(options, key=lambda o: o["device_bytes"] or math.inf)


def _auto_note(precision: str, options: list[dict], chosen: dict, hardware: str) -> str:
    parts = []
    for o in options:
        mem = "-" if o["device_bytes"] is None else _bytes(o["device_bytes"])
        fit = "" if o["fits"] is None else (" fits" if o["fits"] else " does not fit")
        parts.append(f"{o['parallel']} {_ms(o['iteration_ms'])}, {mem} on each GPU{fit}")
    why = "the fastest that fits" if chosen["fits"] is not False else "nothing fits; the smallest"
    return (f"--parallel auto, {precision}: {chosen['parallel']} ({why} in one {hardware}): " + "; ".join(parts)
            + " (device memory: the table's peak allocated bytes plus allocator slack and the CUDA context)")


def _fsdp_notes(profile, gpus: int, nodes: int | None) -> list[str]:
    _, measured = profile.collective_us("all_gather", 1 << 20, gpus, nodes)
    if measured:
        return []
    return [f"FSDP all-gathers and reduce-scatters derived from {profile.name}'s all-reduce measurements "
            "(a ring all-reduce is a reduce-scatter then an all-gather), not measured themselves"]


NODE_FIELDS = ("x", "x_cat", "phase", "grad_bytes", "fresh_bytes", "gemm_layout")
"""The per-node graph tensors the analytic model reads (``prior.AnalyticModel``)."""


def _batch(graphs: list[dict], analytic: bool):
    """The graphs' tensors as one batch: for a GNN a ``torch_geometric`` ``Batch``; for the analytic prior,
    which reads per-node tensors alone, the same fields concatenated in a plain namespace, so that an
    analytic prediction (the README's first command) does not import torch_geometric (~2-3 s cold)."""
    if analytic:
        from types import SimpleNamespace

        sizes = [int(t["x"].shape[0]) for t in graphs]
        fields = {k: torch.cat([t[k] for t in graphs]) for k in NODE_FIELDS if all(k in t for t in graphs)}
        index = torch.repeat_interleave(torch.arange(len(graphs)), torch.tensor(sizes, dtype=torch.long))
        return SimpleNamespace(**fields, batch=index, num_graphs=len(graphs))
    from torch_geometric.data import Batch, Data

    datas = []
    for tensors in graphs:
        d = Data(**tensors)
        d.num_nodes = tensors["x"].shape[0]
        datas.append(d)
    return Batch.from_data_list(datas)


def predict_many(spec: str, precisions: list[str], batch_size: int, seq_len: int | None = None,
                 image_size: int | None = None, gpus: int = 1, hardware: str = "h100",
                 checkpoint: str | Path | None = None, optimizer: str = "adamw", overrides=None,
                 task: str | None = None, steps: int | None = None, epochs: float | None = None,
                 dataset_size: int | None = None, gpu_hour_cost: float | None = None,
                 use_disk_cache: bool = True, nodes: int | None = None, interconnect: str | None = None,
                 bucket_cap_mb: float = 25.0, grad_accum: int = 1,
                 grad_compression: str = "none", parallel: str = "ddp",
                 cpu_kind: str | None = None, analytic: bool = False) -> list[Prediction]:
    """One ``Prediction`` per precision class, all from one checkpoint and one model spec.

    ``cpu_kind`` (a checkpoint trained with hardware descriptors, on a CPU): predict for that CPU, named
    by its stored descriptor or "this", instead of the checkpoint's training hardware.

    ``gpus``/``nodes``/``interconnect``/``bucket_cap_mb``/``grad_accum``/``grad_compression`` describe
    data-parallel training; ``parallel`` is ddp, fsdp, fsdp-no-reshard or auto (gnn_ptp/fsdp.py);
    ``steps`` (optimizer steps) or ``epochs`` x ``dataset_size`` the job. ``analytic``: answer from the
    calibrated physical prior even where a checkpoint is shipped (H100-class GPUs)."""
    dp = DataParallel(gpus, nodes, interconnect, bucket_cap_mb, grad_accum, grad_compression, parallel)
    dp.validate()
    if epochs is not None and not dataset_size:
        raise UserError("--epochs needs --dataset-size (samples per epoch)")
    if steps is not None and epochs is not None:
        raise UserError("give --steps or --epochs, not both")
    ckpt_path, model, meta = _model_for(hardware, checkpoint, analytic, cpu_kind)
    analytic = meta.get("source") == "analytic-prior"
    hw_name = meta["hardware"]
    kind_note = None
    moved = False  # predicting for another CPU kind than the checkpoint's (its held-out figure is not this one's)
    if cpu_kind is not None and not analytic:
        trained_model = model
        model, kind_note = _for_cpu_kind(model, meta, ckpt_path, cpu_kind)
        moved = model is not trained_model
    profile = _interconnect(hw_name, dp) if gpus > 1 else None
    n_nodes = profile.nodes_for(gpus, nodes) if profile is not None else (nodes or 1)
    if gpus > 1 and profile is None:
        raise UserError(f"--gpus {gpus}: no interconnect profile for {hw_name}; give --interconnect "
                        "(a shipped name or a file from gnn-ptp calibrate-comm)")
    if profile is not None:
        profile.level(gpus, nodes)  # before any tracing: a GPU count the interconnect cannot hold
    trained = trained_precisions(meta)
    left_out_note = None
    what = "prior was fitted to" if analytic else "checkpoint was trained on"
    if precisions == ["all"]:
        precisions = trained
        left_out = [p for p in PRECISION_NAMES if p not in trained]
        if left_out:
            left_out_note = (f"--precision all shows the {len(trained)} classes the {hw_name} {what} "
                             f"({', '.join(trained)}); left out: {', '.join(left_out)}, which it "
                             "never saw (name one with --precision for an extrapolation)")
    untrained = {}
    for p in precisions:
        get_precision(p)
        if p not in trained:
            untrained[p] = (f"the {hw_name} {what.split()[0]} never saw {p} (only {', '.join(trained)}): "
                            "this prediction is an extrapolation" + (
                                "; a CPU has no TF32 and trains in fp16 autocast rarely"
                                if hw_name == "cpu" else ""))
    parsed = parse_spec(spec, overrides, task)
    shape = Shape(batch_size, seq_len, image_size)
    configs = [StepConfig(parsed, shape, p, optimizer, meta.get("trace_target", "cuda")) for p in precisions]
    graphs = _graphs(configs, use_disk_cache)
    num_nodes = [int(tensors["x"].shape[0]) for tensors, _ in graphs]
    with torch.no_grad():
        out = model(_batch([tensors for tensors, _ in graphs], analytic))
    from gnn_ptp.hardware import HARDWARE

    global_batch = batch_size * gpus * grad_accum
    total_steps = steps
    if epochs is not None:  # rounded first: 1.1 epochs x 50000 / 100 is 550 steps, not 551
        total_steps = math.ceil(round(epochs * dataset_size / global_batch, 6))
    slowdown = profile.compute_slowdown(gpus, nodes) if profile is not None else 1.0
    ood_notes = [[] if analytic else _ood_warnings(t["u"], t, meta) for t, _ in graphs]
    outside = [i for i, n in enumerate(ood_notes) if n]
    # the stored descriptors are read only where a note will quote a CPU kind's prior
    prior_kind = _checkpoint_cpu_kind(model) if outside and hw_name == "cpu" and not cpu_kind else cpu_kind
    prior_ms = _prior_step_ms([t for t, _ in graphs], outside, hw_name, grad_accum, prior_kind)
    results = []
    for i, (p, (tensors, info)) in enumerate(zip(precisions, graphs)):
        fwd, bwd, opt = out["log_phase_ms"][i].exp().tolist()
        one_gpu = grad_accum * (fwd + bwd) + opt
        compute = one_gpu * slowdown
        ood = list(ood_notes[i])
        if ood and i in prior_ms:  # beyond the checkpoint's range: the prior's answer beside it, no choice made
            ood.append(f"the calibrated prior alone says {prior_ms[i]:.1f} ms a step on one "
                       f"{'CPU' if hw_name == 'cpu' else 'GPU'} here (gnn-ptp predict --hardware {hw_name} "
                       f"--analytic{' --cpu-kind ' + prior_kind if prior_kind else ''}; outside its training "
                       "range the checkpoint's answer rests on no step like this one)")
        beyond = None if analytic else _beyond_step_note(meta, tensors)
        notes = ([kind_note] if kind_note else []) + ([untrained[p]] if p in untrained else []) + ood + (
            [beyond] if beyond else [])
        if left_out_note:
            notes.insert(0, left_out_note)
        if slowdown > 1:
            notes.append(f"{gpus // n_nodes} ranks per node share {profile.compute_slots} compute slots "
                         f"({profile.name}): compute {slowdown:.2f}x slower than one rank alone")
        log_node_ms = None
        if "log_node_ms" in out:
            offset = sum(num_nodes[:i])
            log_node_ms = out["log_node_ms"][offset:offset + num_nodes[i]]
        param_bytes = get_precision(p).param_dtype.itemsize
        estimate = info.get("memory") or {}  # analytic, from the trace (the GNN's memory head is not used)
        capacity = HARDWARE[hw_name].memory_bytes if hw_name in HARDWARE else None
        ddp, comm_notes = (None, []) if dp.parallel.startswith("fsdp") else \
            _allreduce(profile, dp, tensors, log_node_ms, bwd, param_bytes, slowdown)
        comm = ddp.exposed_ms if ddp is not None else 0.0
        mode, mem, device_bytes, options, sharded = "ddp", None, None, [], None
        if estimate:
            mem, device_bytes = float(estimate["peak_bytes"]), float(estimate["device_bytes"])
        if dp.parallel != "ddp" and gpus > 1:
            blocks = _fsdp_blocks(parsed, shape, p)
            modes = [dp.parallel] if dp.parallel != "auto" else ["ddp", "fsdp-no-reshard", "fsdp"]
            for m in modes:
                if m == "ddp":
                    options.append({"parallel": "ddp", "iteration_ms": compute + comm, "comm_exposed_ms": comm,
                                    "memory_per_gpu_bytes": mem, "device_bytes": device_bytes})
                    continue
                step = _fsdp(profile, dp, m, fwd * slowdown, bwd * slowdown, opt * slowdown, blocks,
                             param_bytes)
                per_rank = _fsdp_memory(estimate, blocks, gpus, param_bytes, m)
                options.append({"parallel": m, "iteration_ms": step.iteration_ms, "comm_exposed_ms": step.exposed_ms,
                                "comm_total_ms": step.comm_total_ms, "blocks": step.blocks, "step": step, **per_rank})
            for o in options:
                o["fits"] = None if capacity is None or o["device_bytes"] is None else o["device_bytes"] <= capacity
            chosen = _choose(options)
            mode = chosen["parallel"]
            if dp.parallel == "auto":
                notes.append(_auto_note(p, options, chosen, hw_name))
            if mode != "ddp":
                sharded = chosen["step"]
                comm, mem, device_bytes = sharded.exposed_ms, chosen["memory_per_gpu_bytes"], chosen["device_bytes"]
                compute = sharded.compute_ms
                comm_notes = _fsdp_notes(profile, gpus, nodes)
            else:
                ddp, comm_notes = _allreduce(profile, dp, tensors, log_node_ms, bwd, param_bytes, slowdown)
                comm = ddp.exposed_ms if ddp is not None else 0.0
        notes += comm_notes
        fits = None if capacity is None or device_bytes is None else device_bytes <= capacity
        if fits is False:
            notes.append(f"peak memory {_bytes(device_bytes)} (allocator segments + context) exceeds "
                         f"the {capacity / 1e9:.0f} GB of one {hw_name}: this configuration will run out of "
                         f"memory (--max-batch-size finds the largest batch that fits"
                         + ("; --parallel fsdp shards it over the GPUs)" if gpus > 1 and mode == "ddp" else ")"))
        iteration = compute + comm
        pred = Prediction(
            spec=spec, precision=p, batch_size=batch_size, seq_len=info["shape"]["seq_len"],
            image_size=info["shape"]["image_size"], optimizer=optimizer, gpus=gpus, hardware=hw_name,
            forward_ms=fwd, backward_ms=bwd, optimizer_ms=opt, compute_ms=compute, comm_exposed_ms=comm,
            iteration_ms=iteration, peak_memory_bytes=mem, fits_in_memory=fits, memory=estimate,
            params=info["param_count"], flops=sum(info["summary"]["flops_by_phase"].values()),
            overrides=dict(parsed.overrides), checkpoint=str(ckpt_path or ""), warnings=notes, nodes=n_nodes,
            interconnect=profile.name if profile is not None else "", grad_accum=grad_accum,
            global_batch_size=global_batch, scaling_efficiency=one_gpu / iteration if iteration > 0 else 1.0,
            compute_slowdown=slowdown, parallel=mode, memory_per_gpu_bytes=mem,
            parallel_options=[{k: v for k, v in o.items() if k != "step"} for o in options])
        if sharded is not None:
            pred.comm_total_ms, pred.fabric = sharded.comm_total_ms, profile.level(gpus, nodes).name
        if not analytic:
            pred.expected_error = checkpoint_error(meta, info.get("family"), outside=bool(ood_notes[i]),
                                                   other_kind=moved)
        else:
            err = dict(meta["expected_error"])
            this = _model_error(meta, info["family"], tensors)
            if this is not None:
                err["this_model"] = this
            pred.source, pred.expected_error = "analytic-prior", err
            pred.warnings.insert(0, analytic_warning(hw_name, meta, this))
        if ddp is not None:
            pred.comm_total_ms, pred.allreduce_buckets, pred.fabric = ddp.total_ms, ddp.buckets, ddp.fabric
        if log_node_ms is not None:
            pred.top_ops = _top_ops(log_node_ms, tensors)
            from gnn_ptp.explain import op_breakdown

            pred.op_breakdown = op_breakdown(log_node_ms, tensors)
        if total_steps is not None:
            pred.steps = total_steps
            pred.total_s = iteration * total_steps / 1e3
            pred.gpu_hours = pred.total_s / 3600 * gpus
            if gpu_hour_cost is not None:
                pred.cost = pred.gpu_hours * gpu_hour_cost
        results.append(pred)
    return results


def _for_cpu_kind(model, meta: dict, ckpt_path, cpu_kind: str):
    """(a copy of ``model`` that predicts for ``cpu_kind``'s descriptor, the note saying so)."""
    import copy

    from gnn_ptp import descriptor

    if meta.get("hardware") != "cpu":
        raise UserError(f"--cpu-kind {cpu_kind}: only with a CPU checkpoint (--hardware cpu); this one is for "
                        f"{meta.get('hardware')}")
    cfg = getattr(model, "cfg", None)
    if cfg is None or not cfg.needs_hardware:
        raise UserError(f"--cpu-kind {cpu_kind}: checkpoint {ckpt_path} was trained without hardware descriptors "
                        "and knows only the CPU it was trained on; train one with [model] hardware_descriptor = "
                        "true or target = \"log_ratio_prior\" (gnn-ptp train --data FOLDER [FOLDER ...])")
    stored = descriptor.stored_cpus()
    name = _stored_cpu_name(cpu_kind)
    trained_on = model.descriptor.name if model.descriptor is not None else "?"
    if name == trained_on:
        return model, f"CPU kind {name}: the kind the checkpoint was trained on (the answer without --cpu-kind)"
    chosen = copy.copy(model)  # the cached model keeps its own descriptor
    chosen.descriptor = stored[name]
    note = f"predicted for CPU kind {name} from its measured descriptor (the checkpoint was trained on {trained_on})"
    if cfg.target == "log_ratio_prior":
        # the residual was learned over the training kind's prior: price over that prior moved, not the
        # target kind's own section (34.1 % against 25.0 % on the Intel kind's held-out steps, README)
        chosen.descriptor = descriptor.residual_prior_for(model.descriptor, stored[name],
                                                          meta.get("hardware_kinds") or ())
        if isinstance(chosen.descriptor, descriptor.MovedPrior):
            note += (f", over its prior moved from {trained_on} "
                     f"({descriptor.moved_mode(model.descriptor, stored[name])})")
    if model.descriptor is not None and model.descriptor.kind == "cpu":
        rate, ratio = descriptor.widest_ceiling(model.descriptor, stored[name])
        if max(ratio, 1 / ratio) >= FAR_CEILINGS:
            note += (f"; its {rate} rate is {ratio:.2g}x the training CPU's: trained on one CPU kind and tested on "
                     "another this far from it, the residual GNN trained on the other kinds was 12-35 % off in "
                     "the hardware protocol between kinds with a fast bf16 path and 42 % onto the one without (the "
                     "prior moved there by kernel size 27 %, the shipped checkpoint 25.5 %; README *Protocol*): a "
                     "profiled harvest pass on this CPU does better")
    if stored[name].steps_fitted_on() == name and name != trained_on:
        note += (f"; {name} has a prior fitted to its own profiled steps: --analytic answers from it "
                 f"({_own_prior_error(stored[name])})")
    return chosen, note


def _stored_cpu_name(cpu_kind: str) -> str:
    """The stored descriptor name ``--cpu-kind`` names ("this": this machine's), or one clear error."""
    from gnn_ptp import descriptor

    stored = descriptor.stored_cpus()
    name = descriptor.stored_name(descriptor.cpu_model()) if cpu_kind == "this" else descriptor.SAME_KIND.get(
        cpu_kind, cpu_kind)
    if name not in stored:
        hint = (" (this machine's: measure it with python -m gnn_ptp.descriptor --measure --write)"
                if cpu_kind == "this" else "")
        raise UserError(f"--cpu-kind {cpu_kind}: no stored descriptor {name!r}{hint}; known: "
                        f"{', '.join(sorted(stored)) or 'none'}, or 'this'")
    return name


def _own_prior_error(desc) -> str:
    """The expected error of a CPU kind's own prior section, as its fit measured it (each family left out)."""
    from gnn_ptp import prior

    summary = prior.calibration().get(desc.curves_section(), {}).get("expected_error", {}).get("summary")
    return f"expected error {summary}" if summary else "expected error unknown"


CPU_ANALYTIC_PRECISIONS = ("fp32", "amp-bf16", "bf16")
"""The precision classes a CPU prior's sections are fitted to (the CPU grids' classes)."""


def _cpu_analytic(cpu_kind: str | None):
    """(None, model, meta) answering ``--hardware cpu --analytic`` from a CPU kind's prior: ``cpu_kind``'s
    stored descriptor (default: the reference CPU, the first AMD kind, whose section is ``cpu``), its own
    section where one was fitted to its profiled steps (``calibrate_prior.py --profiles``), else the
    reference CPU's moved by its measured ceilings (``descriptor.Descriptor.profile``). On a kind whose
    steps are far from every checkpoint's training kind (the fourth kind: no fast bf16 path) its own prior
    is the better answer (its section's error with each family left out, which the warning prints, against
    72-100 % for the shipped checkpoint moved there; README *A fourth CPU kind*)."""
    from gnn_ptp import descriptor
    from gnn_ptp.prior import AnalyticModel

    desc = (descriptor.stored_cpus()[_stored_cpu_name(cpu_kind)] if cpu_kind
            else descriptor.calibrated_descriptor("cpu"))
    name = desc.name
    profile = desc.profile()
    if desc.steps_fitted_on() == name:
        err = dict(profile.expected_error or {})
    else:
        err = {"summary": (f"unmeasured on {name}: the reference CPU's prior moved by its measured descriptor "
                           "(the reference CPU's section moved by kernel size was 16.7 % off on the Intel kind "
                           "and 24.1 % on one without a fast bf16 path; split, without shared step probes, 17.1 % "
                           "on the second AMD kind; README *Protocol*)")}
    meta = {"hardware": "cpu", "trace_target": "cpu", "source": "analytic-prior", "expected_error": err,
            "requested": True, "precisions": list(CPU_ANALYTIC_PRECISIONS), "cpu_kind": name,
            "section": desc.curves_section() if desc.steps_fitted_on() == name else None}
    return None, AnalyticModel(profile), meta


FAR_CEILINGS = 2.5
"""A CPU kind whose ceilings differ from the checkpoint's training CPU by this factor or more on one rate
gets a warning with its ``predict --cpu-kind`` answer. Set between the gaps measured on the three CPU
kinds (2026-11-25): the two AMD kinds are 2.47x apart at most (bf16 GEMM), the Intel kind 2.9x and 7.2x
from them. Moved by the ceilings (the form before 2026-11-26) the prior was 32-226 % off between the far
kinds; split (the default since), the residual GNN 17.4-21.6 % between them, 14.3-19.3 % between the AMD
kinds (README *Protocol*); 16.5-25.6 % between them against the Intel kind's five-pass labels (2026-11-26,
fifteenth session)."""


def _model_for(hardware: str, checkpoint: str | Path | None, analytic: bool = False,
               cpu_kind: str | None = None):
    """(checkpoint path or None, model, meta): the given or shipped checkpoint; where no checkpoint exists
    for an H100-class GPU, or where ``analytic`` asks for it, the calibrated physical prior
    (gnn_ptp/prior.py) stands in for the GNN; on a CPU, ``cpu_kind``'s prior (``_cpu_analytic``)."""
    from gnn_ptp.prior import ANALYTIC_HARDWARE, analytic_model

    if analytic:
        if checkpoint:
            raise UserError("--analytic answers from the calibrated prior, without a checkpoint: give "
                            "--analytic or --checkpoint, not both")
        if hardware == "cpu":
            return _cpu_analytic(cpu_kind)
        found = analytic_model(hardware)
        if found is None:
            raise UserError(f"--analytic: no calibrated prior for --hardware {hardware}; it exists for "
                            f"{', '.join(ANALYTIC_HARDWARE)} and cpu")
        model, meta = found
        return None, model, {**meta, "requested": True}
    if checkpoint:
        return Path(checkpoint), *_load_checkpoint(Path(checkpoint))
    try:
        path = default_checkpoint(hardware)
    except UserError:
        found = analytic_model(hardware)
        if found is None:
            raise
        return None, *found
    return path, *_load_checkpoint(path)


def _model_error(meta: dict, family: str, tensors: dict) -> dict | None:
    """The analytic prior's expected error for this model (``prior.model_error``): its family's figure left
    out of the fit, or its kind's; None where the prior's section has no per-family figures (a CPU kind
    priced by another kind's prior moved onto it)."""
    if not meta.get("section"):
        return None
    from gnn_ptp import prior

    return prior.model_error(meta["section"], family, prior.conv_flops_share(tensors["x"], tensors["x_cat"]))


def analytic_warning(hardware: str, meta: dict, this_model: dict | None = None) -> str:
    if meta.get("cpu_kind"):
        hardware = f"{hardware} (kind {meta['cpu_kind']})"
    err = meta.get("expected_error") or {}
    how = f"expected error {err['summary']}" if err.get("summary") else "expected error unknown"
    if this_model:
        how += f"; for {this_model['text']}"
    prior_alone = ("the calibrated physical prior alone (per-kernel roofline with fitted efficiency curves and a "
                   "host launch queue)")
    if meta.get("requested"):  # --analytic, although a checkpoint may be shipped
        return (f"ANALYTIC ESTIMATE (--analytic): these times come from {prior_alone}, not from a checkpoint "
                f"trained on measured {hardware} steps; {how}")
    return (f"ANALYTIC ESTIMATE: no {hardware} checkpoint yet, so these times come from {prior_alone}, not "
            f"from a model trained on measured {hardware} steps; {how}")


def predict(spec: str, precision: str = "amp-bf16", batch_size: int = 8, **kwargs) -> Prediction | list[Prediction]:
    """Predict one training step of ``spec`` (see ``predict_many`` for the keyword arguments).

    ``precision="all"`` returns a list with one ``Prediction`` per precision class."""
    if precision == "all":
        return predict_many(spec, ["all"], batch_size, **kwargs)
    return predict_many(spec, [precision], batch_size, **kwargs)[0]


@dataclass
class BatchFit:
    """The largest batch of one precision class that fits in one device's memory (``--max-batch-size``)."""

    precision: str
    max_batch_size: int
    """Largest batch whose step fits (0: not even one sample)."""
    capacity_bytes: float
    memory: dict
    """The memory estimate at ``max_batch_size`` (at batch 1 when nothing fits)."""
    probes: int = 0
    """Batch sizes traced to find it."""
    prediction: Prediction | None = None
    """The predicted step at ``max_batch_size``; None when nothing fits or no checkpoint exists."""
    throughput_per_s: float | None = None
    throughput_unit: str = ""
    """tokens (text models: batch x seq_len) or samples."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def max_batch_sizes(spec: str, precisions: list[str], seq_len: int | None = None, image_size: int | None = None,
                    hardware: str = "h100", checkpoint: str | Path | None = None, optimizer: str = "adamw",
                    overrides=None, task: str | None = None, use_disk_cache: bool = True,
                    limit: int = 1 << 20, analytic: bool = False) -> tuple[list[BatchFit], list[str]]:
    """For each precision class, the largest batch whose training step fits in one device (analytic
    memory from the trace, gnn_ptp/memory.py: no checkpoint needed), and its predicted step time and
    throughput where a checkpoint exists. Returns the fits and notes for the user."""
    from gnn_ptp.hardware import get_hardware
    from gnn_ptp.precision import CPU_PRECISIONS

    notes: list[str] = []
    timed = True  # step times from the checkpoint, or from the analytic prior where none exists
    try:
        ckpt_path, _, meta = _model_for(hardware, checkpoint, analytic)
    except UserError as e:
        timed, ckpt_path, meta = False, None, {}
        notes.append(f"step time not predicted: {e}")
    hw = get_hardware(meta.get("hardware", hardware))
    target = meta.get("trace_target", "cpu" if hw.name == "cpu" else "cuda")
    if precisions == ["all"]:
        precisions = trained_precisions(meta) if meta else list(
            CPU_PRECISIONS if hw.name == "cpu" else PRECISION_NAMES)
    parsed = parse_spec(spec, overrides, task)
    for p in precisions:
        get_precision(p)
    same = {p: {"tf32": "fp32", "torch-default": "fp32"}.get(p, p) for p in precisions}  # one trace each
    searches = [(StepConfig(parsed, Shape(1, seq_len, image_size), q, optimizer, target), hw.memory_bytes, limit)
                for q in dict.fromkeys(same.values())]
    found = dict(zip(dict.fromkeys(same.values()), _in_workers(_largest_batch, searches)))
    fits = []
    for p in precisions:
        batch, est, probes = found[same[p]]
        fits.append(BatchFit(p, batch, hw.memory_bytes, est.to_dict(), probes))
    if timed:
        by_batch: dict[int, list[BatchFit]] = {}
        for f in fits:
            if f.max_batch_size:
                by_batch.setdefault(f.max_batch_size, []).append(f)
        for batch, group in by_batch.items():
            preds = predict_many(spec, [f.precision for f in group], batch, seq_len=seq_len, image_size=image_size,
                                 hardware=hw.name, checkpoint=ckpt_path, optimizer=optimizer, overrides=overrides,
                                 task=task, use_disk_cache=use_disk_cache, analytic=analytic)
            for f, pred in zip(group, preds):
                f.prediction = pred
                items = batch * (pred.seq_len or 1)
                f.throughput_unit = "tokens" if pred.seq_len else "samples"
                f.throughput_per_s = items / (pred.iteration_ms / 1e3) if pred.iteration_ms > 0 else None
    notes += _merge_warnings([f.prediction for f in fits if f.prediction is not None])
    if any(f.max_batch_size >= limit for f in fits):
        notes.append(f"the search stops at batch {limit}: larger batches may fit too")
    return fits, notes


def _largest_batch(search: tuple) -> tuple:
    """``memory.largest_batch`` for one precision class: (config at batch 1, capacity, limit)."""
    from gnn_ptp import memory
    from gnn_ptp.trace import trace_step

    config, capacity, limit = search
    return memory.largest_batch(
        lambda b: memory.estimate(trace_step(dataclasses.replace(config, shape=dataclasses.replace(
            config.shape, batch_size=b)))), capacity, limit)


def _in_workers(fn, items: list) -> list:
    """``[fn(x) for x in items]``, in forked worker processes where there are several cores (as the
    graph traces of ``_trace_groups``)."""
    workers = min(len(items), os.cpu_count() or 1)
    if workers <= 1 or sys.platform != "linux":
        return [fn(x) for x in items]
    import multiprocessing

    try:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_single_threaded) as pool:
            return pool.map(fn, items, chunksize=1)
    except Exception as e:
        if not _fork_refused(e):
            raise
        return [fn(x) for x in items]


def format_max_batch(spec: str, fits: list[BatchFit], notes: list[str], hardware: str) -> str:
    first = fits[0]
    lines = [f"{spec}: the largest batch whose training step fits in one {hardware} "
             f"({first.capacity_bytes / 1e9:.0f} GB), per precision class", ""]
    lines.append(f"{'precision':<15}{'max batch':>10}{'peak alloc':>12}{'device mem':>12}{'floor':>10}"
                 f"{'step':>10}{'throughput':>18}")
    for f in fits:
        m = f.memory
        if f.max_batch_size == 0:
            lines.append(f"{f.precision:<15}{'none':>10}{_bytes(m['peak_bytes']):>12}{_bytes(m['device_bytes']):>12}"
                         f"{_bytes(m['floor_bytes']):>10}{'-':>10}{'-':>18}  (batch 1 does not fit)")
            continue
        step = _ms(f.prediction.iteration_ms) if f.prediction is not None else "-"
        rate = f"{f.throughput_per_s:,.0f} {f.throughput_unit}/s" if f.throughput_per_s else "-"
        lines.append(f"{f.precision:<15}{f.max_batch_size:>10}{_bytes(m['peak_bytes']):>12}"
                     f"{_bytes(m['device_bytes']):>12}{_bytes(m['floor_bytes']):>10}{step:>10}{rate:>18}")
    lines.append("")
    lines.append("peak alloc: torch.cuda.max_memory_allocated of the step (CPU: live tensor bytes); device mem: "
                 "the allocator's segments + CUDA context; floor: weights + gradients + optimizer state")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def trained_precisions(meta: dict) -> list[str]:
    """The precision classes a checkpoint saw in training, read off the precision one-hot graph
    features of its training ranges (a CPU checkpoint: fp32, amp-bf16, bf16)."""
    if meta.get("precisions"):  # a prior that says which classes it was fitted to (a CPU's)
        return list(meta["precisions"])
    u_max = (meta.get("train_ranges") or {}).get("u_max")
    if not u_max:
        return list(PRECISION_NAMES)
    names = graph_mod.GRAPH_FEATURE_NAMES
    return [p for p in PRECISION_NAMES if u_max[names.index(f"precision={p}")] > 0.5]


def format_predictions(preds: list[Prediction]) -> str:
    first = preds[0]
    dims = f"batch {first.batch_size}" + (f" x seq {first.seq_len}" if first.seq_len else "") + (
        f" x {first.image_size}px" if first.image_size else "")
    over = f" on {first.nodes} node(s) over {first.interconnect} ({first.fabric} fit)" if first.fabric else ""
    accum = f", {first.grad_accum} micro-steps" if first.grad_accum > 1 else ""
    source = (f"checkpoint {first.checkpoint}" if first.source == "checkpoint"
              else "analytic estimate from the calibrated prior, no checkpoint")
    lines = [f"{first.spec} on {first.gpus}x {first.hardware}{over}, {dims} per GPU{accum}, {first.optimizer} "
             f"({source})", ""]
    head = f"{'precision':<15}{'forward':>10}{'backward':>10}{'optimizer':>10}{'compute':>10}{'comm':>10}" \
           f"{'iteration':>11}{'peak mem':>10}"
    lines.append(head + ("" if first.total_s is None else f"{'job':>12}") + (
        "" if first.cost is None else f"{'cost':>10}"))
    fastest = min(preds, key=lambda p: p.iteration_ms)
    for p in preds:
        mem = "-" if not p.peak_memory_bytes else _bytes(p.peak_memory_bytes)
        row = (f"{p.precision:<15}{_ms(p.forward_ms):>10}{_ms(p.backward_ms):>10}{_ms(p.optimizer_ms):>10}"
               f"{_ms(p.compute_ms):>10}{_ms(p.comm_exposed_ms):>10}{_ms(p.iteration_ms):>11}{mem:>10}")
        if p.total_s is not None:
            row += f"{_duration(p.total_s):>12}"
        if p.cost is not None:
            row += f"{p.cost:>10.2f}"
        if len(preds) > 1 and p is fastest:
            row += "  <- fastest"
        lines.append(row)
    if len(preds) > 1:
        slowest = max(preds, key=lambda p: p.iteration_ms)
        lines.append(f"\nfastest: {fastest.precision}, {slowest.iteration_ms / fastest.iteration_ms:.2f}x "
                     f"faster than {slowest.precision}")
    if first.gpus > 1:
        eff = ", ".join(f"{p.precision} {p.scaling_efficiency:.0%}" for p in preds)
        if fastest.parallel == "ddp":
            comm = (f"DDP all-reduce {fastest.allreduce_buckets} bucket(s), {fastest.comm_total_ms:.1f} ms in all "
                    f"({fastest.precision})")
        else:
            kind = "FSDP2 full sharding, ZeRO-3" if fastest.parallel == "fsdp" else \
                "FSDP2 without resharding, ZeRO-2-like"
            comm = (f"{fastest.parallel} ({kind}): all-gathers and reduce-scatters {fastest.comm_total_ms:.1f} ms in "
                    f"all, {fastest.comm_exposed_ms:.1f} ms exposed ({fastest.precision})")
        modes = sorted({p.parallel for p in preds})
        if len(modes) > 1:
            comm += "; modes: " + ", ".join(f"{p.precision} {p.parallel}" for p in preds)
        lines.append(f"data parallel: global batch {first.global_batch_size}; {comm}; peak mem is per GPU; scaling "
                     f"efficiency vs one GPU: {eff}" + (" (over 100 %: the optimizer runs on a 1/N shard)"
                                                       if any(p.scaling_efficiency > 1 for p in preds) else ""))
    if first.total_s is not None:
        lines.append(f"job: {first.steps} optimizer steps of {first.global_batch_size} samples on "
                     f"{first.gpus} GPU(s)")
    if first.top_ops:
        top = ", ".join(f"{t['op']} {_ms(t['ms'])}" for t in fastest.top_ops)
        lines.append(f"where the time goes ({fastest.precision}): {top}")
    err = first.expected_error if first.source == "checkpoint" else {}
    if err.get("summary"):
        this = err.get("this_model", {}).get("text")
        lines.append(f"expected error: {err['summary']}" + (f"; this model: {this}" if this else ""))
    lines += [f"warning: {w}" for w in _merge_warnings(preds)]
    return "\n".join(lines)


_OOD = re.compile(r"^(?P<name>\S+) is (?P<value>\S+), (?P<rest>outside the training range .*)$")


def _merge_warnings(preds: list[Prediction]) -> list[str]:
    """Each warning once; a feature outside the training range in several precision classes is one line
    with each class's value."""
    plain, ood = [], {}
    for p in preds:
        for w in p.warnings:
            m = _OOD.match(w)
            if m and len(preds) > 1:
                ood.setdefault((m["name"], m["rest"]), []).append((m["value"], p.precision))
            elif w not in plain:
                plain.append(w)
    merged = []
    for (name, rest), values in ood.items():
        if len({v for v, _ in values}) == 1:
            shown = values[0][0] if len(values) == len(preds) else ", ".join(f"{v} ({c})" for v, c in values)
        else:
            shown = ", ".join(f"{v} ({c})" for v, c in values)
        merged.append(f"{name} is {shown}, {rest}")
    return sorted(plain + merged)


def _bytes(n: float) -> str:
    """A memory size for the table: GB with one decimal, else whole MB, else whole kB (never "0 MB")."""
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _ms(ms: float) -> str:
    """A time for the table: milliseconds up to 10 s, then seconds (the columns stay 10 wide)."""
    return f"{ms:.1f}ms" if ms < 1e4 else f"{ms / 1e3:.1f}s"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
