"""Trace a deep stack of identical layers once, at five layers, and build the full-depth graph from it.

A Llama-7B step has 32 identical decoder layers: 286 of every 287 recorded ops repeat. Tracing all of
them costs ~6 s per precision class on one core, nearly all of it fake-tensor dispatch of the same ops.
Here the step of the same model with ``TRACED_LAYERS`` (5) layers is recorded with every node tagged by
its layer (``trace.LayerTags``), and the graph of ``L`` layers is built from it: layers 0 and 1 as
traced, ``L - 4`` copies of layer 2, then layers 3 and 4 as the last two. Foreach optimizer ops, which
take every layer's tensors in one list, have the layer-2 stretch of each list repeated.

It is exact, not an approximation: the result equals the full trace node for node (shapes, dtypes,
phases, gradient bytes, edges) and tests/test_replicate.py checks that on every allowed model type,
precision class and trace target. It is used only where that was checked (``ALLOWED_MODEL_TYPES``), only
when the layers are alike (no per-layer ``layer_types`` that differ), and only when the five traced
layers pass consistency checks: layers 1-3 record the same ops with the same shapes, each refers to its
neighbours the same way, and their blocks sit next to each other in the graph. Anything else falls back
to the full trace. ``GNN_PTP_REPLICATE=0`` turns it off.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Callable

import torch

from gnn_ptp.ops import TensorMeta

TRACED_LAYERS = 5
MIN_LAYERS = 8
"""Below this, a full trace is cheap enough and nothing is replicated."""
TEMPLATE = 2
ALLOWED_MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "bert", "roberta", "opt", "vit")
"""transformers model types whose replicated graphs tests/test_replicate.py compares with full traces."""


class NotReplicable(Exception):
    """The five-layer trace is not a regular stack: trace the whole model instead."""


def enabled() -> bool:
    return os.environ.get("GNN_PTP_REPLICATE", "1") != "0"


def plan(workload) -> tuple[str, str, int] | None:
    """(stack path, config key for the layer count, layer count) when ``workload`` can be replicated."""
    config = getattr(workload.model, "config", None)
    if config is None or getattr(config, "model_type", None) not in ALLOWED_MODEL_TYPES:
        return None
    n_layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(n_layers, int) or n_layers < MIN_LAYERS:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and len(set(layer_types)) > 1:
        return None  # e.g. sliding-window layers after max_window_layers: not a uniform stack
    stacks = [name for name, m in workload.model.named_modules()
              if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers
              and len({type(layer) for layer in m}) == 1]
    if len(stacks) != 1:
        return None
    key = getattr(config, "attribute_map", {}).get("num_hidden_layers", "num_hidden_layers")
    return stacks[0], key, n_layers


def trace_by_replication(config, workload, record: Callable):
    """The ``TracedStep`` of ``config`` built from a five-layer trace, or None to trace it whole."""
    from gnn_ptp.precision import get_precision
    from gnn_ptp.spec import build
    from gnn_ptp.trace import TracedStep

    found = plan(workload)
    if found is None:
        return None
    stack, key, n_layers = found
    overrides = tuple((k, v) for k, v in config.spec.overrides if k not in (key, "num_hidden_layers"))
    small_spec = dataclasses.replace(config.spec, overrides=overrides + ((key, TRACED_LAYERS),))
    try:
        small = build(small_spec, config.shape, "meta", get_precision(config.precision).param_dtype)
        if _config_diff(workload.model.config, small.model.config) - {key, "num_hidden_layers", "layer_types"}:
            return None
        graph = record(config, small, stack)
        graph = synthesize(graph, n_layers)
    except Exception:  # NotReplicable, or a model that does not build or trace at five layers
        return None
    return TracedStep(graph, config, workload.shape or config.shape, workload.family, workload.modality,
                      workload.param_count, 0.0)


def _config_diff(a, b) -> set[str]:
    da, db = a.to_dict(), b.to_dict()
    return {k for k in set(da) | set(db) if da.get(k) != db.get(k)}


# --- building L layers from five --------------------------------------------------------------------


def _key(x):
    """What must be equal between two layers' nodes: everything but which node an argument is."""
    if isinstance(x, torch.fx.Node):
        return "node"
    if isinstance(x, (TensorMeta, torch.Tensor)):
        return ("t", tuple(x.shape), tuple(x.stride()), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_key(v) for v in x)
    if isinstance(x, dict):
        return tuple((k, _key(v)) for k, v in x.items())
    return x


def _relative(tags, k):
    """Layer tags as offsets from layer ``k`` (so that layers 1, 2 and 3 compare equal)."""
    if isinstance(tags, (list, tuple)):
        return tuple(_relative(t, k) for t in tags)
    if isinstance(tags, dict):
        return tuple((key, _relative(t, k)) for key, t in tags.items())
    return None if tags is None else tags - k


def _signature(node: torch.fx.Node, k: int):
    m = node.meta
    return (node.op, node.target if node.op == "call_function" else None, m.get("phase"), m.get("grad_bytes", 0),
            _key(node.args), _key(node.kwargs), _key(m.get("val")), _key(m.get("in")),
            _relative(m.get("in_tags"), k), _relative(m.get("val_tags"), k))


def _refs(node: torch.fx.Node) -> list[torch.fx.Node]:
    refs: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), refs.append)
    return refs


def synthesize(graph: torch.fx.Graph, n_layers: int) -> torch.fx.Graph:
    """The graph of ``n_layers`` layers from ``graph``, a tagged trace of ``TRACED_LAYERS`` layers."""
    if n_layers < TRACED_LAYERS:
        raise NotReplicable(f"{n_layers} layers: fewer than the {TRACED_LAYERS} traced")
    nodes = list(graph.nodes)
    tag = {n: n.meta.get("layer") for n in nodes}
    if any(t is not None and not 0 <= t < TRACED_LAYERS for t in tag.values()):
        raise NotReplicable("a node mixes the tensors of several layers")
    layer = {k: [n for n in nodes if tag[n] == k] for k in range(TRACED_LAYERS)}
    ordinal = {n: i for k in layer for i, n in enumerate(layer[k])}
    position = {n: i for i, n in enumerate(nodes)}
    _check_layers_alike(layer, tag, ordinal)
    last_copy = n_layers - 3  # copies of the template are layers 2 .. L-3; traced 3, 4 become L-2, L-1

    out = torch.fx.Graph()
    env: dict[tuple[torch.fx.Node, int | None], torch.fx.Node] = {}

    def ref(y: torch.fx.Node, owner: int | None, copy: int | None) -> torch.fx.Node:
        """The new node that ``y`` becomes, as seen from a node of layer ``owner`` (copy ``copy``)."""
        t = tag[y]
        if copy is not None:  # a copy of a template node
            if t == TEMPLATE:
                return env[(y, copy)]
            if t == TEMPLATE - 1:
                return env[(y, None)] if copy - 1 == TEMPLATE - 1 else env[(layer[TEMPLATE][ordinal[y]], copy - 1)]
            if t == TEMPLATE + 1:
                return env[(y, None)] if copy + 1 == last_copy + 1 else env[(layer[TEMPLATE][ordinal[y]], copy + 1)]
            return env[(y, None)]
        if t != TEMPLATE:
            return env[(y, None)]
        if owner == TEMPLATE - 1:
            return env[(y, TEMPLATE)]
        if owner == TEMPLATE + 1:
            return env[(y, last_copy)]
        raise NotReplicable(f"{y.format_node()} of a middle layer is read outside a list by a node of layer {owner}")

    def emit(node: torch.fx.Node, copy: int | None) -> None:
        owner = tag[node]
        args, kwargs = node.args, node.kwargs
        meta = dict(node.meta)
        if copy is None and owner is None and _has_template_elements(meta.get("in_tags")):
            args, kwargs, meta = _expand_lists(node, meta, ref, last_copy)
        else:
            args, kwargs = torch.fx.node.map_arg((args, kwargs), lambda y: ref(y, owner, copy))
        new = out.create_node(node.op, node.target, args, kwargs, name=node.name)
        meta.pop("in_tags", None)
        meta.pop("val_tags", None)
        if copy is not None:
            meta["layer"] = copy
        elif owner is not None and owner > TEMPLATE:
            meta["layer"] = owner + n_layers - TRACED_LAYERS
        new.meta = meta
        env[(node, copy)] = new

    i = 0
    try:
        while i < len(nodes):
            if tag[nodes[i]] != TEMPLATE:
                emit(nodes[i], None)
                i += 1
                continue
            j = i
            while j < len(nodes) and tag[nodes[j]] == TEMPLATE:
                j += 1
            copies = range(TEMPLATE, last_copy + 1)
            for c in (copies if _ascending(nodes, i, j, tag, ordinal, layer, position) else reversed(copies)):
                for node in nodes[i:j]:
                    emit(node, c)
            i = j
    except KeyError as e:
        raise NotReplicable(f"a node refers to one not built yet: {e}") from None
    return out


def _check_layers_alike(layer, tag, ordinal) -> None:
    """Layers 1-3 record the same ops, and each refers to its own, previous and next layer the same way."""
    sizes = {k: len(v) for k, v in layer.items()}
    if len(set(sizes.values())) != 1 or not sizes[TEMPLATE]:
        raise NotReplicable(f"layers record different numbers of ops: {sizes}")

    def relations(node, k):
        rel = []
        for y in _refs(node):
            t = tag[y]
            if t == k:
                rel.append(("self", ordinal[y]))
            elif t == k - 1:
                rel.append(("prev", ordinal[y]))
            elif t == k + 1:
                rel.append(("next", ordinal[y]))
            else:
                rel.append(("abs", y))
        return rel

    for i, node in enumerate(layer[TEMPLATE]):
        sig, rel = _signature(node, TEMPLATE), relations(node, TEMPLATE)
        for k in (TEMPLATE - 1, TEMPLATE + 1):
            other = layer[k][i]
            if _signature(other, k) != sig or relations(other, k) != rel:
                raise NotReplicable(f"layer {k} differs from layer {TEMPLATE} at {node.format_node()}")


def _ascending(nodes, i, j, tag, ordinal, layer, position) -> bool:
    """Whether the run ``nodes[i:j]`` of template nodes sits between layer 1's and layer 3's (forward
    order) or between 3's and 1's (backward), each neighbour being the same stretch of its own layer."""
    if i == 0 or j >= len(nodes):
        raise NotReplicable("a middle layer's ops start or end the graph")
    first, last = ordinal[nodes[i]], ordinal[nodes[j - 1]]
    before, after = nodes[i - 1], nodes[j]
    for lower, upper, ascending in ((TEMPLATE - 1, TEMPLATE + 1, True), (TEMPLATE + 1, TEMPLATE - 1, False)):
        if (tag[before] == lower and ordinal[before] == last and tag[after] == upper
                and ordinal[after] == first):
            runs = (layer[lower][first:last + 1], layer[upper][first:last + 1])
            if all(position[run[-1]] - position[run[0]] == len(run) - 1 for run in runs):
                return ascending
    raise NotReplicable(f"layer {TEMPLATE}'s ops at {nodes[i].format_node()} do not sit between its neighbours'")


def _has_template_elements(tags) -> bool:
    if isinstance(tags, (list, tuple)):
        return any(_has_template_elements(t) for t in tags)
    if isinstance(tags, dict):
        return any(_has_template_elements(t) for t in tags.values())
    return tags == TEMPLATE


def _expand_lists(node, meta, ref, last_copy):
    """A global node over every layer's tensors (a foreach optimizer op): in each of its lists, the
    stretch of layer-2 entries is repeated once per copy, in its args, input metadata and value."""
    args_in, kwargs_in = meta["in"]
    tags_args, tags_kwargs = meta["in_tags"]
    span = _template_span(tags_args) or _template_span(list(tags_kwargs.values()))
    if span is None:
        raise NotReplicable(f"{node.format_node()}: layer-2 entries outside any list")
    start, end, length = span

    def new_arg(a, tags):
        if isinstance(a, (list, tuple)) and len(a) == length:
            return type(a)(_grow(a, start, end, last_copy, lambda v, copy: _element(v, copy, ref)))
        if isinstance(a, (list, tuple)) and _has_template_elements(tags):
            raise NotReplicable(f"{node.format_node()}: lists of different lengths hold layer-2 tensors")
        return torch.fx.node.map_arg(a, lambda y: ref(y, None, None))

    def new_meta(m):
        return type(m)(_grow(m, start, end, last_copy, lambda v, copy: _fresh(v))) \
            if isinstance(m, (list, tuple)) and len(m) == length else m

    args = tuple(new_arg(a, t) for a, t in zip(node.args, tags_args))
    kwargs = {k: new_arg(v, tags_kwargs.get(k)) for k, v in node.kwargs.items()}
    meta["in"] = (type(args_in)(new_meta(a) for a in args_in), {k: new_meta(v) for k, v in kwargs_in.items()})
    val, val_tags = meta.get("val"), meta.get("val_tags")
    if isinstance(val, (list, tuple)) and isinstance(val_tags, list) and TEMPLATE in val_tags:
        s, e, _ = _template_span([val_tags])
        meta["val"] = type(val)(_grow(val, s, e, last_copy, lambda v, copy: _fresh(v)))
    return args, kwargs, meta


def _grow(values, start: int, end: int, last_copy: int, element) -> list:
    """``values`` with its layer-2 stretch ``[start, end)`` repeated for copies 2 .. ``last_copy``; each
    entry passed through ``element(value, copy)`` (copy None outside the stretch)."""
    values = list(values)
    middle = [element(v, copy) for copy in range(TEMPLATE, last_copy + 1) for v in values[start:end]]
    return [element(v, None) for v in values[:start]] + middle + [element(v, None) for v in values[end:]]


def _fresh(value):
    """A new TensorMeta for each entry, as a trace makes: cost formulas tell tensors apart by identity."""
    return copy.copy(value) if isinstance(value, TensorMeta) else value


def _element(arg, copy, ref):
    """A list entry of a global node, as seen from copy ``copy`` of the layer-2 stretch (None: outside it)."""
    if not isinstance(arg, torch.fx.Node):
        return arg
    owner = arg.meta.get("layer")
    if owner == TEMPLATE:
        if copy is None:
            raise NotReplicable(f"a layer-2 tensor outside the layer-2 stretch of a list: {arg.format_node()}")
        return ref(arg, None, copy)  # this layer's own tensor (a parameter, a gradient, a state)
    if copy is not None and owner is not None:
        raise NotReplicable(f"layer {owner}'s tensor in the layer-2 stretch of a list: {arg.format_node()}")
    return ref(arg, None, None)  # the list's producer (a foreach op before it), the same for every copy


def _template_span(tag_lists) -> tuple[int, int, int] | None:
    """(start, end, length) of the contiguous layer-2 stretch of the first list that has one."""
    for tags in tag_lists:
        if isinstance(tags, list) and TEMPLATE in tags:
            where = [i for i, t in enumerate(tags) if t == TEMPLATE]
            if where[-1] - where[0] + 1 != len(where):
                raise NotReplicable("a list's layer-2 entries are not contiguous")
            return where[0], where[-1] + 1, len(tags)
    return None
