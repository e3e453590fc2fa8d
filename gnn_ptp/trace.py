"""Trace one training step into an aten-level torch.fx graph, on fake tensors: no GPU, no real memory.

One step is what users run: forward and loss (inside autocast for AMP classes), backward, the optimizer
step (the foreach kernels PyTorch uses on a GPU), and for ``amp-fp16`` the GradScaler's work (scale the
loss, unscale and check the gradients, update the scale). The model is built on the ``meta`` device and
every tensor is a FakeTensor, so a Llama-7B config traces on a laptop.

Every call_function node of the result carries ``meta["val"]`` (FakeTensor: shape, dtype) and
``meta["phase"]`` (forward, backward or optimizer). With ``target="cuda"`` the dtypes and kernels are
those of an H100 (see ``cuda_dispatch``); with ``target="cpu"`` they are the CPU's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import weakref
from pathlib import Path
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from gnn_ptp import cuda_dispatch, ops, replicate
from gnn_ptp.errors import UserError, closest, first_line, user_code_error
from gnn_ptp.precision import get_precision
from gnn_ptp.spec import ModelSpec, Shape, build, py_file

OPTIMIZERS = ("adamw", "adam", "sgd")
TARGETS = ("cuda", "cpu")
PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class StepConfig:
    """Everything that fixes the graph of one training step."""

    spec: ModelSpec
    shape: Shape
    precision: str
    optimizer: str = "adamw"
    target: str = "cuda"
    """``cuda`` for an NVIDIA GPU (H100, H200), ``cpu`` for a CPU."""
    kernels: str | None = None
    """The torch version whose GPU kernel choices the trace follows (a record's own torch, so that a graph
    says what ran when it was measured); None: the installed torch's."""

    def __post_init__(self):
        get_precision(self.precision)
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"unknown optimizer {self.optimizer!r}; allowed: {', '.join(OPTIMIZERS)}"
                            + closest(self.optimizer, OPTIMIZERS))
        if self.target not in TARGETS:
            raise UserError(f"unknown trace target {self.target!r}; allowed: {', '.join(TARGETS)}")


@dataclass
class TracedStep:
    graph: torch.fx.Graph
    """aten-level graph of the step. Each call_function node carries meta["val"] (its output, or what
    it wrote in place), meta["in"] (its input values: args, kwargs) and meta["phase"]."""
    config: StepConfig
    shape: Shape
    """The shape actually used (defaults for seq_len / image_size filled in)."""
    family: str
    modality: str
    param_count: int
    trace_s: float


class _Recorder(TorchDispatchMode):
    """Records every aten op that reaches the Python dispatch key into a torch.fx graph.

    It sits above FakeTensorMode, so it sees exactly what ``make_fx`` sees (ops after autocast and
    autograd, composites decomposed) at a fifth of the cost: no proxies, no pytree specs, no codegen.
    Data flow is tracked by tensor identity; an op that writes an argument in place (``add_``,
    ``_foreach_mul_``) becomes that tensor's producer for later readers.

    It holds no reference to a live tensor (nodes keep ``ops.TensorMeta`` snapshots, producers are
    found through weak references): an extra reference would change what autograd does (it copies a
    gradient it cannot steal) and the trace would hold kernels the real step never runs.
    """

    def __init__(self, graph: torch.fx.Graph, host: set[int], layers: "LayerTags | None" = None):
        super().__init__()
        self.graph = graph
        self.producer: dict[int, tuple[weakref.ref, torch.fx.Node, int | None]] = {}
        self.host = host      # ids of host-side tensors (optimizer step counters), alive all along
        self.lifted: set[int] = set()
        self.externals = 0
        self.layers = layers  # when set, every node is tagged with the repeated layer it belongs to

    def _entry(self, t: torch.Tensor) -> tuple | None:
        entry = self.producer.get(id(t))
        return entry if entry is not None and entry[0]() is t else None

    def node_of(self, t: torch.Tensor) -> torch.fx.Node | None:
        entry = self._entry(t)
        return entry[1] if entry is not None else None

    def _tag_of(self, t: torch.Tensor) -> int | None:
        entry = self._entry(t)
        return entry[2] if entry is not None else None

    def _produced(self, t: torch.Tensor, node: torch.fx.Node, tag: int | None = None) -> None:
        self.producer[id(t)] = (weakref.ref(t), node, tag)

    def placeholder(self, name: str, t: torch.Tensor) -> None:
        node = self.graph.placeholder(name)
        node.meta["val"] = ops.TensorMeta(t)
        tag = None
        if self.layers is not None:
            tag = node.meta["layer"] = self.layers.seeded.get(id(t))
        self._produced(t, node, tag)

    def _arg(self, x):
        if isinstance(x, torch.Tensor):
            node = self.node_of(x)
            if node is None:
                self.externals += 1
                node = self.graph.placeholder(f"external_{self.externals}")
                node.meta["val"] = ops.TensorMeta(x)
                tag = None
                if self.layers is not None:
                    tag = node.meta["layer"] = self.layers.seeded.get(id(x), self.layers.context_tag())
                self._produced(x, node, tag)
            return node
        if isinstance(x, (list, tuple)):
            return type(x)(self._arg(v) for v in x)
        return x

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "prim":
            return out
        tensors = _flat_tensors((args, kwargs))
        if tensors and all(id(t) in self.host or id(t) in self.lifted for t in tensors) \
                and any(id(t) in self.host for t in tensors):
            self.host.update(id(t) for t in _flat_tensors(out))
            return out  # runs on the host: not a GPU kernel
        node = self.graph.call_function(func, self._arg(args), {k: self._arg(v) for k, v in kwargs.items()})
        written = written_tensors(func, args, kwargs)
        outputs = _flat_tensors(out)
        node.meta["val"] = ops.snapshot(out if outputs else written)  # in-place ops: what they wrote
        node.meta["in"] = ops.snapshot((args, kwargs))                  # input shapes/dtypes, for costs
        if self.layers is not None:
            self._tag(node, func, args, kwargs, tensors, outputs, written)
        else:
            for t in outputs + written:
                self._produced(t, node)
        if func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            self.lifted.update(id(t) for t in _flat_tensors(out))
        return out

    def _tag(self, node, func, args, kwargs, inputs, outputs, written) -> None:
        """Tag ``node`` (and each tensor it produced) with the repeated layer it belongs to, for
        ``replicate``: a node's own tag (``meta["layer"]``), and one tag per tensor of its inputs
        (``meta["in_tags"]``) and of its value (``meta["val_tags"]``), because a foreach op's lists
        hold every layer's tensors at once."""
        node.meta["in_tags"] = _map_tensors((args, kwargs), self._tag_of)
        foreach = "foreach" in func.__name__  # _foreach_*, _amp_foreach_non_finite_check_and_unscale_
        if foreach:
            own = None  # one op over every parameter: global, its lists are expanded per layer
        else:
            own = self.layers.context_tag()
            if own is None and self.layers.infer_from_inputs:  # a per-parameter optimizer op
                found = {self._tag_of(t) for t in inputs} - {None}
                own = found.pop() if len(found) == 1 else (LayerTags.MIXED if found else None)
        node.meta["layer"] = own
        if foreach:
            first_list = next((a for a in args if isinstance(a, (list, tuple))), [])
            first_tags = [self._tag_of(t) if isinstance(t, torch.Tensor) else None for t in first_list]
            out_tags = first_tags if len(outputs) == len(first_tags) else [None] * len(outputs)
        else:
            out_tags = [own] * len(outputs)
        written_tags = [self._tag_of(t) if foreach else own for t in written]
        node.meta["val_tags"] = out_tags if outputs else written_tags
        for t, tag in zip(outputs + written, out_tags + written_tags):
            self._produced(t, node, tag)


@dataclass
class LayerTags:
    """Which layer of a repeated stack (``model.layers``) each recorded op belongs to.

    Forward ops are tagged by hooks on the stack's modules; backward ops by the autograd node that
    runs them (its sequence number falls in the window its layer's forward created, or it accumulates
    the gradient of that layer's parameter); per-parameter optimizer ops by the tensors they touch."""

    MIXED = -1

    seeded: dict[int, int | None] = dataclasses.field(default_factory=dict)
    """id(tensor) -> layer, for parameters, optimizer state and step counters."""
    windows: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    """(first, end) autograd sequence numbers created by each layer's forward, and the layer."""
    current: int | None = None
    infer_from_inputs: bool = False

    def context_tag(self) -> int | None:
        if self.current is not None:
            return self.current
        node = torch._C._current_autograd_node()
        if node is None:
            return None
        variable = getattr(node, "variable", None)
        if variable is not None:  # AccumulateGrad: the parameter's layer
            return self.seeded.get(id(variable))
        seq = node._sequence_nr()
        for first, end, layer in self.windows:
            if first <= seq < end:
                return layer
        return None

    @classmethod
    def seeded_from(cls, stack: str, named_params: dict, inputs: dict, steps: list) -> "LayerTags":
        """Tags with each parameter of ``stack`` (``model.layers.<k>.…``), its optimizer state and its
        step counter seeded with its layer ``k``."""
        tags = cls()
        layer_of = {name: int(name[len(stack) + 1:].split(".", 1)[0])
                    for name in named_params if name.startswith(stack + ".")}
        trainable_names = [k for k, p in named_params.items() if p.requires_grad]
        for name, t in inputs["params"].items():
            tags.seeded[id(t)] = layer_of.get(name)
        for per_param in (*inputs["state"], steps):
            for name, t in zip(trainable_names, per_param):
                tags.seeded[id(t)] = layer_of.get(name)
        return tags

    def hook(self, stack: torch.nn.ModuleList) -> list:
        handles = []
        for k, module in enumerate(stack):
            def pre(_module, _args, k=k):
                self.current = k
                self._first = torch.autograd._get_sequence_nr()

            def post(_module, _args, _out, k=k):
                self.windows.append((self._first, torch.autograd._get_sequence_nr(), k))
                self.current = None

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        return handles


def _map_tensors(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return [_map_tensors(v, fn) for v in x]
    if isinstance(x, dict):
        return {k: _map_tensors(v, fn) for k, v in x.items()}
    return None


def written_tensors(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an op writes in place (``add_``'s self, every list of ``_foreach_mul_``), per its schema."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written += _flat_tensors(args[i] if i < len(args) else kwargs.get(arg.name))
    return written


def _flat_tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat_tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _flat_tensors(v)]
    return []


def _fake_like(t: torch.Tensor) -> torch.Tensor:
    """A fake CPU tensor with the shape, strides and dtype of a meta tensor (inside a FakeTensorMode)."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return out.requires_grad_(t.requires_grad)


@contextlib.contextmanager
def _python_optimizer_steps(step_value: float):
    """Non-capturable foreach Adam reads each step counter with ``.item()`` (a host-side read that fake
    tensors cannot answer). Answer it with a plausible step number: only Python scalars depend on it."""
    import torch.optim.adam as adam_module

    original = adam_module._get_value
    adam_module._get_value = lambda x: step_value if isinstance(x, torch.Tensor) else x
    try:
        yield
    finally:
        adam_module._get_value = original


def _optimizer_update(name: str, params, grads, state, steps, foreach: bool):
    """The optimizer's update as ``torch.optim`` runs it by default: the foreach kernels on a GPU, one
    parameter at a time on a CPU."""
    if name == "sgd":
        from torch.optim.sgd import sgd

        sgd(params, grads, state[0], foreach=foreach, weight_decay=0.0, momentum=0.9, lr=0.01,
            dampening=0.0, nesterov=False, maximize=False)
        return
    from torch.optim.adam import adam

    kwargs = dict(foreach=foreach, capturable=False, differentiable=False, fused=None,
                  amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-3, eps=1e-8, maximize=False)
    if name == "adamw":
        try:
            adam(params, grads, state[0], state[1], [], steps, weight_decay=0.01,
                 decoupled_weight_decay=True, **kwargs)
            return
        except TypeError:  # torch without decoupled_weight_decay in adam(): use adamw()
            from torch.optim.adamw import adamw

            adamw(params, grads, state[0], state[1], [], steps, weight_decay=0.01, **kwargs)
            return
    adam(params, grads, state[0], state[1], [], steps, weight_decay=0.0, **kwargs)


# These classes change which tensor-core mode matmuls and convolutions use, not the graph: they share
# the fp32 trace, and the graph converter reads the TF32 switches from the precision class.
_SAME_TRACE_AS = {"tf32": "fp32", "torch-default": "fp32"}


def shared_trace(config: StepConfig) -> StepConfig:
    """The step config whose trace ``config``'s graph is converted from: configs with the same one share a
    trace (traced once in a process, then converted per precision class)."""
    base = _SAME_TRACE_AS.get(config.precision)
    return config if base is None else dataclasses.replace(config, precision=base)


def trace_step(config: StepConfig) -> TracedStep:
    """Trace the training step of ``config`` (cached: the same graph is traced once per process)."""
    base = shared_trace(config)
    if base is config:
        return _trace_cached(config)
    return dataclasses.replace(_trace_cached(base), config=config)


@functools.lru_cache(maxsize=32)
def _trace_cached(config: StepConfig) -> TracedStep:
    try:
        return _trace_uncached(config)
    except UserError:
        raise
    except Exception as e:
        cause = e.__cause__ if isinstance(e, TraceError) and e.__cause__ is not None else e
        error = _settings_error(config, cause)
        if error is None:
            raise
        raise error from e


def _settings_error(config: StepConfig, e: BaseException) -> UserError | None:
    """A built-in model (hf, torchvision, timm, random) that fails to build or trace under settings the
    user chose (``--set`` values, a sequence length, an image size, batch 1) fails because of them:
    ``--set n_head=5`` on a 768-wide GPT-2, a 100-pixel image for 16-pixel ViT patches. Named as the
    user's error, with what they gave. None when nothing was chosen (then it is ours) or when the model
    is valid PyTorch the tracer cannot follow."""
    if config.spec.source == "py" or _beyond_tracing(e):
        return None
    shape = config.shape
    chosen = [f"{k}={v}" for k, v in config.spec.overrides]
    chosen += [f"--seq-len {shape.seq_len}"] if shape.seq_len is not None else []
    chosen += [f"--image-size {shape.image_size}"] if shape.image_size is not None else []
    chosen += ["--batch-size 1"] if shape.batch_size == 1 else []
    if not chosen:
        return None
    return UserError(f"{config.spec.spec} does not build or run with {', '.join(chosen)}: {type(e).__name__}: "
                     f"{' '.join(first_line(e).split())} (change those values; --debug shows the traceback)")


def _trace_uncached(config: StepConfig) -> TracedStep:
    start = time.perf_counter()
    precision = get_precision(config.precision)
    workload = build(config.spec, config.shape, "meta", precision.param_dtype)
    if replicate.enabled():
        traced = replicate.trace_by_replication(config, workload, _record)
        if traced is not None:
            return dataclasses.replace(traced, trace_s=time.perf_counter() - start)
    graph = _record(config, workload)
    return TracedStep(graph, config, workload.shape or config.shape, workload.family, workload.modality,
                      workload.param_count, time.perf_counter() - start)


def _record(config: StepConfig, workload, stack: str | None = None) -> torch.fx.Graph:
    """Record the step of ``workload`` into a graph. With ``stack`` (the path of a ModuleList of
    repeated layers, e.g. ``model.layers``), every node is tagged with its layer (``meta["layer"]``)."""
    precision = get_precision(config.precision)
    model = workload.model
    named_params = dict(model.named_parameters())
    named_buffers = dict(model.named_buffers())
    n_state = {"sgd": 1, "adam": 2, "adamw": 2}[config.optimizer]
    semantics = cuda_dispatch.cuda_semantics if config.target == "cuda" else cuda_dispatch.cpu_semantics

    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    with fake_mode:
        fake = lambda t: _fake_like(t) if isinstance(t, torch.Tensor) else t  # noqa: E731
        inputs = {
            "params": {k: fake(v) for k, v in named_params.items()},
            "buffers": {k: fake(v) for k, v in named_buffers.items()},
            "state": [[torch.zeros_like(fake(p)) for p in named_params.values() if p.requires_grad]
                      for _ in range(n_state)],
            "args": [fake(a) for a in workload.args],
            "kwargs": {k: fake(v) for k, v in workload.kwargs.items()},
            "targets": {k: fake(v) for k, v in workload.targets.items()},
            "scaler": [torch.full((), 65536.0), torch.zeros((), dtype=torch.int32)],
        }
        # Adam's step counters live on the host (non-capturable foreach Adam): ops on them are no kernels
        steps = [torch.zeros((), dtype=torch.float32) for p in named_params.values() if p.requires_grad]
    graph = torch.fx.Graph()
    # On a GPU, non-capturable optimizers keep their step counters on the host: no kernels. On a CPU,
    # counting the step is one more op like the others.
    layers = None
    if stack is not None:
        layers = LayerTags.seeded_from(stack, named_params, inputs, steps)
        handles = layers.hook(model.get_submodule(stack))
    recorder = _Recorder(graph, host={id(t) for t in steps} if config.target == "cuda" else set(),
                         layers=layers)
    for group, tensors in inputs.items():
        for i, t in enumerate(_flat_tensors(tensors)):
            recorder.placeholder(f"{group}_{i}", t)
    marks: dict[str, int] = {}

    def mark(phase: str) -> None:
        marks[phase] = len(graph.nodes)

    trainable = [p for p in inputs["params"].values() if p.requires_grad]
    try:
        with semantics(precision.autocast_dtype, config.kernels) as autocast_region, fake_mode, \
                _python_optimizer_steps(10.0), recorder:
            mark("forward")
            with autocast_region():
                output = torch.func.functional_call(model, (inputs["params"], inputs["buffers"]),
                                                    tuple(inputs["args"]), inputs["kwargs"], strict=False)
                loss = workload.loss_fn(output, **inputs["targets"])
            _mark_held(recorder, (output, loss))
            scale, growth_tracker = inputs["scaler"]
            if precision.grad_scaler:
                loss = loss * scale
            mark("backward")
            # .backward() as users call it, not autograd.grad(): gradient accumulation into .grad
            # copies the gradients it cannot steal (layout contract), and those copies are kernels too
            loss.backward()
            grads = [p.grad for p in trainable]
            mark("optimizer")
            if layers is not None:
                layers.infer_from_inputs = True
            for g in grads:  # which kernel finalises which gradient: for the all-reduce overlap model
                node = recorder.node_of(g) if g is not None else None
                if node is not None:
                    node.meta["grad_bytes"] = node.meta.get("grad_bytes", 0) + g.numel() * g.element_size()
            used = [i for i, g in enumerate(grads) if g is not None]
            pick = lambda xs: [xs[i] for i in used]  # noqa: E731  (unused parameters get no update)
            grads = pick(grads)
            with torch.no_grad():  # as in torch.optim: the update is not differentiated
                if precision.grad_scaler:  # GradScaler.unscale_, with its per-device copies
                    found_inf = torch.full((), 0.0, dtype=torch.float32)
                    inv_scale = scale.double().reciprocal().float()
                    found_inf = found_inf.to(found_inf.device, copy=True)
                    torch._amp_foreach_non_finite_check_and_unscale_(
                        grads, found_inf, inv_scale.to(inv_scale.device, copy=True))
                _optimizer_update(config.optimizer, pick(trainable), grads,
                                  [pick(s) for s in inputs["state"]], pick(steps), foreach=config.target == "cuda")
                if precision.grad_scaler:
                    torch._amp_update_scale_(scale, growth_tracker, found_inf, 2.0, 0.5, 2000)
    except UserError:
        raise
    except Exception as e:
        user_file = py_file(config.spec)
        if user_file is not None and not _beyond_tracing(e):  # the user's model or inputs (a shape
            # mismatch...): their error, located in their file
            doing = f"tracing the training step ({config.precision})"
            if not _raised_in(e, user_file):
                doing += f" of the model {config.spec.name.rpartition(':')[2]}() returned"
            raise user_code_error(e, user_file, doing) from e
        raise TraceError(f"could not trace a training step of {config.spec} "
                         f"({config.precision}): {type(e).__name__}: {e}") from e
    finally:
        if stack is not None:
            for handle in handles:
                handle.remove()

    _annotate_phases(graph, marks)
    _drop_unused_constants(graph)
    return graph


def _beyond_tracing(e: BaseException) -> bool:
    """Valid PyTorch that a trace on fake tensors cannot follow (a Python branch on a tensor's value, an
    op without a fake kernel): a limit of the tracer (TraceError), not a mistake in the user's code."""
    from torch._subclasses import fake_tensor

    kinds = tuple(getattr(fake_tensor, n) for n in ("DataDependentOutputException", "DynamicOutputShapeException",
                                                     "UnsupportedOperatorException") if hasattr(fake_tensor, n))
    return isinstance(e, kinds) or "data-dependent" in str(e).lower() or "DataDependent" in type(e).__name__


def _raised_in(e: BaseException, file: Path) -> bool:
    import traceback

    target = Path(file).resolve()
    return any(Path(f.filename).resolve() == target for f in traceback.extract_tb(e.__traceback__))


def _mark_held(recorder: _Recorder, values) -> None:
    """Mark the tensors a training loop holds until the step ends (the model's output, with any KV
    cache it returns, and the loss) on the nodes that made them: ``meta["held"]``, for ``memory``."""
    seen: set[int] = set()

    def walk(x, depth: int) -> None:
        if depth > 6 or id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            node = recorder.node_of(x)
            if node is not None:
                node.meta.setdefault("held", []).append(ops.TensorMeta(x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v, depth + 1)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v, depth + 1)
        elif hasattr(x, "__dict__") and not isinstance(x, (type, torch.nn.Module)):
            for v in vars(x).values():  # a ModelOutput's fields, a DynamicCache's layers
                walk(v, depth + 1)

    walk(values, 0)


class TraceError(RuntimeError):
    """A model that cannot be traced (a data-dependent Python branch, an op with no fake kernel...)."""


def _annotate_phases(graph: torch.fx.Graph, marks: dict[str, int]) -> None:
    bounds = [(marks.get(p, 1 << 62), p) for p in PHASES]
    for index, node in enumerate(graph.nodes):
        node.meta["phase"] = max((b for b in bounds if index >= b[0]), default=(0, "forward"))[1]


def _drop_unused_constants(graph: torch.fx.Graph) -> None:
    """Constants lifted only for host-side ops (``torch.tensor(1.0)`` for Adam's step counters), and the
    outside tensors that only they read."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and node.target in (
                torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default):
            graph.erase_node(node)
        elif node.op == "placeholder" and not node.users and node.target.startswith("external_"):
            graph.erase_node(node)
