"""Peak memory of a training step from its traced graph: a liveness pass, no GPU, no checkpoint.

Every recorded op says what it allocates (its outputs, unless its schema says they alias an input), and
the graph says who reads each tensor last. Walking the step in order, each storage is allocated by the
op that creates it and freed after its last reader, except what outlives the step:

- what exists before it (parameters and buffers, optimizer state, the batch, the GradScaler's scale),
- the gradients (``.grad``, read by the optimizer, freed only by the next ``zero_grad``),
- what the training loop holds until the step ends: the model's output (logits, and the KV cache a
  Hugging Face model returns) and the loss (``trace`` marks them ``meta["held"]``).

The steady-state step is modelled (the collector's loop, after warm-up): optimizer state already exists
when the forward pass starts, and ``zero_grad(set_to_none=True)`` has freed the last step's gradients.
Under AMP the parameters (and so gradients and AdamW state) stay fp32 and the lowered copies of weights
and activations appear as the casts they are; under pure bf16 everything is bf16; GradScaler's state
and unscale are in the graph. Saved activations are simply tensors whose last reader is a backward op.

On the ``cuda`` target the figure is what ``torch.cuda.max_memory_allocated`` reports: every block
rounded up to 512 bytes (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp) plus the cuBLAS
workspaces the allocator holds. ``reserved_bytes`` adds the segment granularity (small blocks share
2 MiB segments, large ones are rounded up to 2 MiB; fragmentation not modelled) and ``device_bytes``
the CUDA context, which lives outside the allocator: that is what must fit in the GPU. On the ``cpu``
target it is live tensor bytes, as the CPU allocator reports them to torch.profiler.

Not modelled: workspaces that kernels allocate inside one op and free before returning (flash
attention's backward accumulators, cuDNN convolution workspaces, oneDNN scratch on CPUs).
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass

import torch

from gnn_ptp import ops
from gnn_ptp.trace import PHASES, TracedStep

MiB = 1 << 20
CUDA_BLOCK_BYTES = 512
"""Every CUDA caching-allocator block is a multiple of this (``kMinBlockSize``)."""
CUDA_SMALL_BYTES = 1 * MiB
"""Blocks up to this size come from the small pool (``kSmallSize``)."""
CUDA_SMALL_SEGMENT_BYTES = 2 * MiB
"""Small blocks are carved from segments of this size (``kSmallBuffer``)."""
CUDA_LARGE_ROUND_BYTES = 2 * MiB
"""Large segments are rounded up to a multiple of this (``kRoundLarge``)."""
CUBLAS_WORKSPACE_BYTES = 32 * MiB
"""cuBLAS workspace on sm90 (H100/H200): ``4096 * 8 * 1024`` bytes in PyTorch's
aten/src/ATen/cuda/CublasHandlePool.cpp (8 MiB + 128 KiB on older GPUs), allocated through the caching
allocator once per (cuBLAS handle, stream) and kept. Handles are per thread: the forward pass and the
optimizer run on the Python thread, the backward pass on autograd's device thread, so a step that
multiplies matrices in both holds two."""
CUDA_CONTEXT_BYTES = 512 * MiB
"""CUDA context, cuBLAS/cuDNN handles and loaded kernels: device memory outside the caching allocator,
so not in ``max_memory_allocated`` but not available to it either. An estimate, not a measurement of
this project: the usual nvidia-smi reading of a PyTorch process with lazy module loading (CUDA >= 11.7)
on an H100 is 0.5-0.6 GB. Replace it with the difference between nvidia-smi and
``torch.cuda.memory_reserved`` on a real H100 when one is available."""

KINDS = ("weights", "gradients", "optimizer_state", "inputs", "activations", "workspace")
"""What live memory is, in the breakdown at the peak: parameters and buffers; gradients; optimizer and
GradScaler state; the batch; saved activations, temporaries and the held output; cuBLAS workspaces."""


@dataclass
class MemoryEstimate:
    """The memory of one training step, from ``estimate``. Bytes."""

    target: str
    """``cuda`` (caching-allocator blocks, cuBLAS workspaces) or ``cpu`` (live tensor bytes)."""
    peak_bytes: int
    """Peak allocated bytes over the step: ``torch.cuda.max_memory_allocated`` on a GPU, peak live
    tensor bytes on a CPU."""
    peak_phase: str
    """forward, backward or optimizer: where the peak falls."""
    peak_by_phase: dict[str, int]
    """Peak allocated bytes within each phase."""
    at_peak: dict[str, int]
    """What is live at the peak, by kind (``KINDS``)."""
    reserved_bytes: int
    """What the caching allocator holds at the peak at least: segment granularity, no fragmentation
    (equal to ``peak_bytes`` on a CPU)."""
    context_bytes: int
    """Device memory outside the allocator (CUDA context); 0 on a CPU."""
    param_bytes: int
    """Parameters (trainable or not)."""
    grad_bytes: int
    """Gradients of the trainable parameters."""
    optimizer_state_bytes: int
    """Optimizer state (AdamW: exp_avg and exp_avg_sq) and the GradScaler's scale and growth tracker."""

    @property
    def floor_bytes(self) -> int:
        """Weights + gradients + optimizer state: no step of this model needs less."""
        return self.param_bytes + self.grad_bytes + self.optimizer_state_bytes

    @property
    def device_bytes(self) -> int:
        """What the device must have: reserved segments + the context."""
        return self.reserved_bytes + self.context_bytes

    def fits(self, capacity_bytes: float) -> bool:
        return self.device_bytes <= capacity_bytes

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), floor_bytes=self.floor_bytes, device_bytes=self.device_bytes)


def estimate(traced: TracedStep) -> MemoryEstimate:
    """Peak memory of the traced step (see the module docstring for what is counted). ~0.1 s for a
    Llama-7B step; the collector is paused meanwhile (the pass makes no cycles, and full collections
    over a big graph's nodes cost twice the pass)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _Liveness(traced).run()
    finally:
        if paused:
            gc.enable()


def estimate_config(config) -> MemoryEstimate:
    """``estimate`` of a ``StepConfig``, traced (and cached) first."""
    from gnn_ptp.trace import trace_step

    return estimate(trace_step(config))


def storage_bytes(t) -> int:
    """Bytes of the storage a fresh tensor of this shape and strides needs (0 when empty)."""
    if any(s == 0 for s in t.shape):
        return 0
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    return span * t.dtype.itemsize


def cuda_block_bytes(nbytes: int) -> int:
    """The caching allocator's block for a request of ``nbytes``."""
    return 0 if nbytes <= 0 else -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def _key(t) -> tuple:
    return tuple(t.shape), t.dtype, tuple(t.stride())


def _metas(x) -> list:
    if isinstance(x, (ops.TensorMeta, torch.Tensor)):
        return [x]
    if isinstance(x, (list, tuple)):
        return [m for v in x for m in _metas(v)]
    return []


_PLACEHOLDER_KIND = {"params": "weights", "buffers": "weights", "state": "optimizer_state",
                     "scaler": "optimizer_state", "args": "inputs", "kwargs": "inputs", "targets": "inputs",
                     "external": "inputs"}


class _Liveness:
    """Two passes: (1) storages, their aliases and last readers; (2) the sweep that adds them up."""

    def __init__(self, traced: TracedStep):
        self.traced = traced
        self.target = traced.config.target
        self.nodes = list(traced.graph.nodes)
        self.size: list[int] = []        # storage id -> bytes (as the allocator counts them)
        self.raw: list[int] = []         # storage id -> bytes requested
        self.kind: list[str] = []
        self.first: list[int] = []       # index of the node that allocates it (-1: before the step)
        self.last: list[int] = []        # index of its last reader
        self.outlives: list[bool] = []   # alive until the step ends (persistent, gradient, held)
        self.outs: dict[torch.fx.Node, list[tuple[tuple, tuple[int, ...]]]] = {}
        self.pending: dict[object, list[int]] = {}  # loop locals waiting for their replacement
        self.schemas: dict[object, tuple] = {}       # op -> (arguments, by name, returns)

    # -- pass 1 ------------------------------------------------------------------------------------

    def _new(self, nbytes: int, kind: str, index: int, outlives: bool = False) -> int:
        self.raw.append(nbytes)
        self.size.append(cuda_block_bytes(nbytes) if self.target == "cuda" else nbytes)
        self.kind.append(kind)
        self.first.append(index)
        self.last.append(index)
        self.outlives.append(outlives)
        return len(self.size) - 1

    def _resolve(self, producer, meta, position: int | None = None) -> tuple[int, ...]:
        """The storages a reader of ``producer`` reads, given the value it saw (``meta``)."""
        outs = self.outs.get(producer)
        if not outs:
            return ()
        if len(outs) == 1:
            return outs[0][1]
        if position is not None and position < len(outs):
            return outs[position][1]
        if meta is not None:
            key = _key(meta)
            found = tuple(s for k, sids in outs if k == key for s in sids)
            if found:
                return found
        return tuple(s for _, sids in outs for s in sids)  # cannot tell which output: all of them

    def _reads(self, arg, meta) -> list[tuple[int, ...]]:
        """Storages read through one argument (a node, or a list of nodes as foreach ops take)."""
        if isinstance(arg, torch.fx.Node):
            return [self._resolve(arg, meta)]
        if isinstance(arg, (list, tuple)):
            metas = meta if isinstance(meta, (list, tuple)) and len(meta) == len(arg) else [None] * len(arg)
            producers = {a for a in arg if isinstance(a, torch.fx.Node)}
            if len(producers) == 1 and all(isinstance(a, torch.fx.Node) for a in arg) \
                    and len(self.outs.get(arg[0], ())) == len(arg):
                return [self._resolve(arg[0], m, k) for k, m in enumerate(metas)]  # a whole list, in order
            return [s for a, m in zip(arg, metas) for s in self._reads(a, m)]
        return []

    def _arg_values(self, node):
        """(schema argument, fx value, traced input value) for each argument of ``node``."""
        args_in, kwargs_in = node.meta.get("in", ((), {}))
        schema = self.schemas.get(node.target)
        if schema is None:
            found = getattr(node.target, "_schema", None)
            arguments = list(found.arguments) if found is not None else []
            schema = self.schemas[node.target] = (arguments, {a.name: a for a in arguments},
                                                  list(found.returns) if found is not None else [])
        arguments, by_name, _ = schema
        out = [(arguments[i] if i < len(arguments) else None, a, args_in[i] if i < len(args_in) else None)
               for i, a in enumerate(node.args)]
        for k, a in node.kwargs.items():
            out.append((by_name.get(k), a, kwargs_in.get(k)))
        return out

    def _outputs(self, index: int, node, arguments) -> None:
        """Which storages ``node``'s outputs are: new ones, or those of the inputs they alias."""
        metas = _metas(node.meta.get("val"))
        by_set = {}
        written = []
        for schema_arg, value, seen in arguments:
            info = getattr(schema_arg, "alias_info", None)
            if info is not None:
                for s in info.before_set:
                    by_set.setdefault(s, (value, seen))
                if info.is_write:
                    written += self._reads(value, seen)
        returns = self.schemas[node.target][2]
        result = []
        if not returns and written and len(written) == len(metas):  # in-place foreach: what it wrote
            result = [(_key(m), sids) for m, sids in zip(metas, written)]
        else:
            for j, m in enumerate(metas):
                ret = returns[j] if len(returns) == len(metas) else (returns[0] if len(returns) == 1 else None)
                info = getattr(ret, "alias_info", None)
                source = next((by_set[s] for s in (info.before_set if info is not None else ()) if s in by_set),
                              None)
                if source is not None:
                    value, seen = source
                    reads = self._reads(value, seen)
                    if isinstance(value, (list, tuple)) and len(reads) == len(metas):
                        sids = reads[j]
                    else:
                        sids = tuple(s for r in reads for s in r)
                    result.append((_key(m), sids))
                else:
                    result.append((_key(m), (self._new(storage_bytes(m), "activations", index),)))
        self.outs[node] = result

    def _pass1(self) -> None:
        optimizer_start = None
        for index, node in enumerate(self.nodes):
            if node.op == "placeholder":
                m = node.meta.get("val")
                if m is not None and (node.users or not node.target.startswith("scaler_")):  # no GradScaler
                    kind = _PLACEHOLDER_KIND.get(node.target.split("_")[0], "inputs")
                    self.outs[node] = [(_key(m), (self._new(storage_bytes(m), kind, -1, outlives=True),))]
                continue
            if node.op != "call_function":
                continue
            phase = node.meta.get("phase", "forward")
            if phase == "optimizer" and optimizer_start is None:
                optimizer_start = index
            arguments = self._arg_values(node)
            for _, value, seen in arguments:
                for sids in self._reads(value, seen):
                    for s in sids:
                        self.last[s] = index
                        # made before the optimizer phase and read by it: a gradient, kept in .grad
                        if phase == "optimizer" and not self.outlives[s] and self.first[s] < optimizer_start:
                            self.outlives[s] = True
                            self.kind[s] = "gradients"
            if phase == "optimizer" and node.target in self.pending:
                self._replace_locals(index, node)
            self._outputs(index, node, arguments)
            if phase == "optimizer":
                self._loop_locals(index, node, arguments)
            for m in node.meta.get("held", ()):
                for s in self._resolve(node, m):
                    self.outlives[s] = True
        for waiting in self.pending.values():  # the last parameter's: freed when the step returns
            for s in waiting:
                self.last[s] = len(self.nodes) - 1

    def _loop_locals(self, index: int, node, arguments) -> None:
        """A per-parameter optimizer (``torch.optim``'s single-tensor loop, as on a CPU) binds its last
        temporary to a local (AdamW's ``denom``, read by the in-place update of the parameter): it is
        freed only when the next parameter's replaces it, after that one is allocated."""
        if "foreach" in node.target.__name__:
            return
        written = {s for key, sids in self.outs[node] for s in sids}
        if not written or not all(self.first[s] < 0 for s in written):
            return  # not an in-place update of a parameter or optimizer state
        for _, value, seen in arguments:
            for sids in self._reads(value, seen):
                for s in sids:
                    if self.first[s] >= 0 and not self.outlives[s] and s not in written:
                        op = self.nodes[self.first[s]].target
                        self.pending.setdefault(op, []).append(s)

    def _replace_locals(self, index: int, node) -> None:
        """Free the loop locals that ``node`` replaces (one allocated by the same op)."""
        for s in self.pending.pop(node.target, ()):
            self.last[s] = max(self.last[s], index)

    # -- pass 2 ------------------------------------------------------------------------------------

    def _workspaces(self) -> int:
        """cuBLAS workspaces: one per thread that runs a matmul (see CUBLAS_WORKSPACE_BYTES)."""
        if self.target != "cuda":
            return 0
        threads, is_matmul = set(), {}
        for node in self.nodes:
            if node.op != "call_function":
                continue
            if node.target not in is_matmul:
                is_matmul[node.target] = ops.category(ops.canonical(node.target)) == "matmul"
            if is_matmul[node.target]:
                threads.add("backward" if node.meta.get("phase") == "backward" else "python")
        return len(threads) * CUBLAS_WORKSPACE_BYTES

    def run(self) -> MemoryEstimate:
        self._pass1()
        n = len(self.nodes)
        allocs: list[list[int]] = [[] for _ in range(n)]
        frees: list[list[int]] = [[] for _ in range(n)]
        live = dict.fromkeys(KINDS, 0)
        small = large = 0  # for the reserved estimate (cuda)
        for s, size in enumerate(self.size):
            if self.first[s] < 0:
                live[self.kind[s]] += size
            else:
                allocs[self.first[s]].append(s)
            if not self.outlives[s]:
                frees[self.last[s]].append(s)
        live["workspace"] = self._workspaces()
        is_cuda = self.target == "cuda"

        def block(s: int) -> tuple[int, int]:
            if not is_cuda:
                return 0, 0
            if self.size[s] <= CUDA_SMALL_BYTES:
                return self.size[s], 0
            return 0, -(-self.size[s] // CUDA_LARGE_ROUND_BYTES) * CUDA_LARGE_ROUND_BYTES

        for s, size in enumerate(self.size):
            if self.first[s] < 0:
                a, b = block(s)
                small, large = small + a, large + b
        large += live["workspace"]
        total = sum(live.values())
        peak, peak_index, at_peak = total, 0, dict(live)
        reserved = large + -(-small // CUDA_SMALL_SEGMENT_BYTES) * CUDA_SMALL_SEGMENT_BYTES
        by_phase = dict.fromkeys(PHASES, 0)
        for index, node in enumerate(self.nodes):
            if not allocs[index] and not frees[index]:
                continue
            for s in allocs[index]:
                live[self.kind[s]] += self.size[s]
                total += self.size[s]
                a, b = block(s)
                small, large = small + a, large + b
            phase = node.meta.get("phase", "forward")
            by_phase[phase] = max(by_phase[phase], total)
            reserved = max(reserved, large + -(-small // CUDA_SMALL_SEGMENT_BYTES) * CUDA_SMALL_SEGMENT_BYTES)
            if total > peak:
                peak, peak_index, at_peak = total, index, dict(live)
            for s in frees[index]:
                live[self.kind[s]] -= self.size[s]
                total -= self.size[s]
                a, b = block(s)
                small, large = small - a, large - b
        return MemoryEstimate(
            target=self.target, peak_bytes=peak,
            peak_phase=self.nodes[peak_index].meta.get("phase", "forward") if self.nodes else "forward",
            peak_by_phase={p: b for p, b in by_phase.items() if b}, at_peak=at_peak,
            reserved_bytes=max(reserved, peak) if is_cuda else peak,
            context_bytes=CUDA_CONTEXT_BYTES if is_cuda else 0,
            param_bytes=self._placeholder_bytes("params"),
            grad_bytes=int(sum(n.meta.get("grad_bytes", 0) for n in self.nodes)),
            optimizer_state_bytes=self._placeholder_bytes("state") + self._placeholder_bytes("scaler"))

    def _placeholder_bytes(self, group: str) -> int:
        return sum(storage_bytes(n.meta["val"]) for n in self.nodes
                   if n.op == "placeholder" and n.target.startswith(group + "_") and "val" in n.meta
                   and (n.users or group != "scaler"))


# --- measured labels on a CPU ----------------------------------------------------------------------


def profiler_peak_bytes(prof) -> int:
    """Peak of the bytes allocated on the CPU during ``prof`` and not yet freed, from its memory events
    (``torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True)``).

    Memory that existed before the profiler started is not in it (the CPU allocator reports only what
    it saw allocated, and ignores frees of older blocks), so the step's peak allocated bytes are
    ``resident_bytes(...)`` taken just before the profiled region plus this. Profile a region that
    frees nothing allocated before it (call ``zero_grad(set_to_none=True)`` before starting the
    profiler, not inside it): such a free would go unseen and the figure would read high."""
    from torch.autograd import DeviceType

    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    total = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        total += e.nbytes()
        peak = max(peak, total)
    return int(peak)


def resident_bytes(*objects) -> int:
    """Bytes of the distinct storages of every tensor in ``objects``: modules (parameters, buffers,
    ``.grad``), optimizers (their state), tensors, and lists, tuples and dicts of them."""
    seen: dict[int, int] = {}

    def add(t: torch.Tensor) -> None:
        t = getattr(t, "_local_tensor", t)  # a DTensor (FSDP2's sharded parameters and state): its shard
        if t.device.type != "meta":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()

    def walk(x) -> None:
        if isinstance(x, torch.Tensor):
            add(x)
            if x.grad is not None:
                add(x.grad)
        elif isinstance(x, torch.nn.Module):
            for t in (*x.parameters(), *x.buffers()):
                walk(t)
        elif isinstance(x, torch.optim.Optimizer):
            for state in x.state.values():
                walk(state)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    for obj in objects:
        walk(obj)
    return sum(seen.values())


def measure_cpu_peak(config, warmup_steps: int = 1) -> dict:
    """Run the training step of ``config`` (a ``StepConfig``) for real on this CPU, as the collector
    runs it (``zero_grad(set_to_none=True)``, forward and loss under autocast, backward, optimizer
    step; output and loss held until the step ends), after ``warmup_steps`` steps that create the
    optimizer state, and measure its peak allocated bytes with torch.profiler's memory events.

    Returns ``peak_bytes`` (resident before the step + the profiler's peak), ``resident_bytes`` and
    ``profiled_peak_bytes``."""
    from torch.profiler import ProfilerActivity, profile

    from gnn_ptp.collect import make_optimizer
    from gnn_ptp.precision import get_precision
    from gnn_ptp.spec import build

    precision = get_precision(config.precision)
    workload = build(config.spec, config.shape, "cpu", precision.param_dtype)
    model = workload.model
    optimizer = make_optimizer(config.optimizer, model.parameters())
    autocast = dict(device_type="cpu", dtype=precision.autocast_dtype or torch.float32,
                    enabled=precision.uses_autocast)
    if precision.grad_scaler:
        raise ValueError(f"{config.precision}: GradScaler steps are not measured on a CPU")

    def step():
        with torch.autocast(**autocast):
            output = model(*workload.args, **workload.kwargs)
            loss = workload.loss_fn(output, **workload.targets)
        loss.backward()
        optimizer.step()
        return output, loss

    for _ in range(warmup_steps):
        optimizer.zero_grad(set_to_none=True)
        step()
    optimizer.zero_grad(set_to_none=True)
    inputs = (workload.args, workload.kwargs, workload.targets)
    resident = resident_bytes(model, optimizer, inputs)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        held = step()
    del held
    profiled = profiler_peak_bytes(prof)
    return {"peak_bytes": resident + profiled, "resident_bytes": resident, "profiled_peak_bytes": profiled,
            "kind": CPU_LABEL_KIND}


CPU_LABEL_KIND = "cpu_profiler_peak_allocated"
"""``memory.kind`` of a record whose ``peak_bytes`` is ``measure_cpu_peak``'s (resident + profiler peak)."""
CUDA_LABEL_KIND = "cuda_max_memory_allocated"
"""``memory.kind`` of a GPU record: ``torch.cuda.max_memory_allocated`` over the run (the collector's)."""


def check_records(path, status: str | None = None) -> list[dict]:
    """The analytic estimate against every single-process record under ``path`` that can judge it: ok
    records with a peak-allocated label (``CPU_LABEL_KIND``, ``CUDA_LABEL_KIND``; peak-RSS labels
    cannot) and out-of-memory records, which must be predicted not to fit. One row per record; only
    records of ``status`` where given (each record is traced)."""
    from gnn_ptp.dataset import step_config_of, trace_target
    from gnn_ptp.hardware import HARDWARE
    from gnn_ptp.records import iter_records
    from gnn_ptp.trace import trace_step

    rows = []
    for r in iter_records(path):
        if (r.get("ddp") or {}).get("world_size", 1) != 1 or (status and r.get("status") != status):
            continue
        kind = (r.get("memory") or {}).get("kind")
        if not (r.get("status") == "oom" or (r.get("status") == "ok" and kind in (CPU_LABEL_KIND, CUDA_LABEL_KIND))):
            continue
        hardware = r["env"]["hardware"]
        # traced with the kernel choices of the torch that measured it, as the dataset's graphs are: torch
        # 2.11 runs float32 grouped-query attention on the math path, whose saved scores 2.14's kernels lack
        est = estimate(trace_step(step_config_of(r["config"], trace_target(hardware),
                                                 kernels=r["env"].get("torch"))))
        capacity = HARDWARE[hardware].memory_bytes if hardware in HARDWARE else None
        row = {"key": r["key"], "status": r["status"], "hardware": hardware, "config": r["config"],
               "predicted_bytes": est.peak_bytes, "device_bytes": est.device_bytes, "floor_bytes": est.floor_bytes,
               "predicted_fits": None if capacity is None else est.fits(capacity)}
        if r["status"] == "ok":
            row["measured_bytes"] = r["memory"]["peak_bytes"]
            row["error"] = est.peak_bytes / r["memory"]["peak_bytes"] - 1
        rows.append(row)
    return rows


# --- the largest batch that fits -------------------------------------------------------------------


def largest_batch(estimate_at, capacity_bytes: float, limit: int = 1 << 20) -> tuple[int, MemoryEstimate, int]:
    """The largest batch size whose step fits in ``capacity_bytes`` (``MemoryEstimate.fits``), searched
    with ``estimate_at(batch) -> MemoryEstimate``. Returns (batch, its estimate, estimates made); batch
    0 (with batch 1's estimate) when not even one sample fits, ``limit`` at most.

    Memory grows nearly linearly with the batch, so each probe is the batch the line through the two
    nearest probes predicts to fill the memory, then its neighbour to confirm the edge (batch 1, 2, the
    guess, the guess + 1 is the usual path); a guess outside the bracket falls back to doubling (no
    upper bound yet) or bisection. The answer is always checked: b fits and b + 1 does not."""
    probes: dict[int, MemoryEstimate] = {}

    def fits(b: int) -> bool:
        if b not in probes:
            probes[b] = estimate_at(b)
        return probes[b].fits(capacity_bytes)

    if not fits(1):
        return 0, probes[1], len(probes)
    lo, hi = 1, None  # lo fits; hi (when known) does not
    candidate, bracketed = 2, 0
    while hi is None or hi - lo > 1:
        b = candidate
        if hi is not None:
            bracketed += 1
            if bracketed % 3 == 0:  # interpolation can creep from one side: bisect every third probe
                b = (lo + hi) // 2
        if fits(b):
            lo = b
            if lo >= limit:
                break
        else:
            hi = b
        guess = _guess(probes, lo, hi, capacity_bytes)
        candidate = min(max(guess, lo + 1), limit) if hi is None else min(max(guess, lo + 1), hi - 1)
    return lo, probes[lo], len(probes)


def _guess(probes: dict, lo: int, hi: int | None, capacity: float) -> int:
    """The batch where the memory reaches ``capacity`` on the lines through two probes (the two largest
    that fit while there is no upper bound, then the bracket ``lo``, ``hi``): one line per phase, since
    the peak is the largest of three nearly linear phase peaks and can move from one phase to another
    (a big model's optimizer step at batch 1, its backward pass at batch 3)."""
    if hi is None:
        fitting = sorted(b for b in probes if b <= lo)
        if len(fitting) < 2:
            return 2 * lo
        a, b = fitting[-2], fitting[-1]
    else:
        a, b = lo, hi
    ea, eb = probes[a], probes[b]
    overhead = eb.device_bytes - eb.peak_bytes  # segments and context beyond the allocated bytes
    guesses = []
    for phase, pb in eb.peak_by_phase.items():
        pa = ea.peak_by_phase.get(phase, 0)
        if pb > pa:
            guesses.append(int(a + (capacity - overhead - pa) * (b - a) // (pb - pa)))
    if not guesses:
        return 2 * lo if hi is None else (lo + hi) // 2
    return min(guesses)
