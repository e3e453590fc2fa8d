"""Profiled steps onto traced graphs: which graph node ran as which profiled op, and for how long.

The harvest stores, beside a record, the aten ops of one real step (``profiles.py``): composite ops and
what they called, each with its input shapes, phase and time. The traced graph has one node per kernel
(``graph.to_tensors``). Per phase, both are walked in order: a graph node is matched to the next profiled
op of the same canonical name (``ops.canonical``) that is not inside an op already matched, preferring one
whose first input has the node's first input shape, within a window of the profile (and a short look back
for ops run in another order). A matched node's time is its op's inclusive time (device time on a GPU, host
time on a CPU) less the inclusive time of what it called that an earlier node already took: an autocast
cast inside ``nll_loss`` or the ``clone`` inside an in-place ``hardswish_`` is its own graph node, matched
first, and is not counted again in its caller's. So no phase matches more than its profiled total.

What is not matched is reported by name: composite wrappers' own host time (``aten::linear`` around its
``addmm``), ops the tracer does not see, fused or decomposed differently. ``matched_share`` is the matched
time over all profiled time of the three phases (every op's self time counted once).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from gnn_ptp import ops
from gnn_ptp.trace import PHASES, TracedStep

MATCH_VERSION = 3
"""Bumped when the matching changes what a node takes (caches of matches carry it). 2: a short look back,
and only ops some graph node could take count in the window. 3: a node's time leaves out what it called
that is already another node's (no time counted twice)."""
WINDOW = 400
"""How far ahead in a phase's profiled ops a graph node's partner is looked for."""
NAME_ONLY_WINDOW = 24
"""How far ahead a partner of the same name but another first input shape is accepted."""
LOOKBACK = 16
"""How far behind the walk's position a not yet matched partner of the same name and first input shape is
taken first: on a GPU, autocast casts a composite op's arguments (input, weight, bias) in another order
than the trace records them, and without a look back the walk jumps ahead to the next layer's cast."""


@dataclass
class Match:
    node_ms: list[float]
    """Per graph node (``graph.to_tensors`` order): its measured time, NaN where unmatched."""
    matched_ms: dict[str, float]
    total_ms: dict[str, float]
    unmatched_nodes: Counter = field(default_factory=Counter)
    """Graph ops without a partner in the profile, by name."""
    unmatched_ms: Counter = field(default_factory=Counter)
    """Profiled time left unmatched, by op name (self time)."""

    @property
    def matched_share(self) -> float:
        total = sum(self.total_ms.values())
        return sum(self.matched_ms.values()) / total if total else float("nan")

    def to_dict(self) -> dict:
        return {"matched_share": self.matched_share, "matched_ms": self.matched_ms, "total_ms": self.total_ms,
                "nodes": len(self.node_ms), "nodes_matched": sum(not math.isnan(t) for t in self.node_ms),
                "unmatched_nodes": dict(self.unmatched_nodes.most_common(10)),
                "unmatched_ms": {k: round(v, 4) for k, v in self.unmatched_ms.most_common(10)}}


def kernel_nodes(traced: TracedStep) -> list[tuple[str, int, tuple | None]]:
    """(canonical op, phase index, first input shape) of every graph node, in ``graph.to_tensors`` order."""
    out = []
    for node in traced.graph.nodes:
        if node.op != "call_function":
            continue
        op = ops.canonical(node.target)
        if op in ops.FREE_OPS:
            continue
        args, kwargs = node.meta.get("in", ((), {}))
        first = next((tuple(t.shape) for t in ops._tensors(args)), None)
        out.append((op, PHASES.index(node.meta.get("phase", "forward")), first))
    return out


def _canonical(name: str) -> str:
    name = name.removeprefix("aten::")
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return ops.ALIASES.get(name, name)


PROFILER_FLOOR = 0.25
"""A node's time less the profiler's cost (``match_profile``'s ``profiler_us_per_op``) keeps at least this
share of its profiled time."""


def match_profile(traced: TracedStep | None, profile: dict, nodes: list | None = None,
                  profiler_us_per_op: tuple[float, float, float] | None = None) -> Match:
    """Match a stored profile (``profiles.compact``) onto the traced graph of the same configuration (or
    onto its ``kernel_nodes``, given instead of the trace). ``profiler_us_per_op`` (per phase; a CPU
    profile's ``profiles.profiler_cost_us``): what the profiler added to each op it recorded, taken off a
    node's time once for its own op and once for every op under it the node takes (at most down to
    ``PROFILER_FLOOR`` of it)."""
    cols = {c: i for i, c in enumerate(profile["columns"])}
    rows = profile["ops"]
    on_gpu = profile.get("device") == "cuda"
    incl = cols["device_us"] if on_gpu else cols["cpu_us"]
    self_col = cols["self_device_us"] if on_gpu else cols["self_cpu_us"]
    names = [_canonical(profile["names"][r[cols["name"]]]) for r in rows]
    first_shape = []
    for r in rows:
        shapes = profile["sigs"][r[cols["sig"]]][0]
        first_shape.append(next((tuple(s) for s in shapes if isinstance(s, list) and s), None))
    children: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        children.setdefault(r[cols["parent"]], []).append(i)

    nodes = kernel_nodes(traced) if nodes is None else nodes
    node_ms = [math.nan] * len(nodes)
    matched_ms = dict.fromkeys(PHASES, 0.0)
    total_ms = dict.fromkeys(PHASES, 0.0)
    covered = [False] * len(rows)
    for i, r in enumerate(rows):
        if r[cols["phase"]] >= 0:
            total_ms[PHASES[r[cols["phase"]]]] += r[self_col] / 1e3
    unmatched_nodes: Counter = Counter()
    for phase_id, phase in enumerate(PHASES):
        wanted = {op for op, node_phase, _ in nodes if node_phase == phase_id}
        # only ops some node could take: host-only rows (a GPU AdamW's .item() per parameter, views) do
        # not use up the window
        candidates = [i for i, r in enumerate(rows) if r[cols["phase"]] == phase_id and names[i] in wanted]
        pos = 0
        for n, (op, node_phase, shape) in enumerate(nodes):
            if node_phase != phase_id:
                continue
            best = None
            for k in range(max(0, pos - LOOKBACK), pos):  # reordered a little (autocast casts a wrapper's
                i = candidates[k]                            # arguments in another order on a GPU)
                if not covered[i] and names[i] == op and shape is not None and first_shape[i] == shape:
                    best = k
                    break
            for k in range(pos, min(pos + WINDOW, len(candidates))) if best is None else ():
                i = candidates[k]
                if covered[i] or names[i] != op:
                    continue
                if shape is None or first_shape[i] is None or first_shape[i] == shape:  # lists show no shapes
                    best = k
                    break
                if best is None and k - pos < NAME_ONLY_WINDOW:
                    best = k  # the same op with another first shape: taken only if nothing closer fits
            if best is None:
                unmatched_nodes[op] += 1
                continue
            i = candidates[best]
            own_us = rows[i][incl]
            taken = 1
            stack = list(children.get(i, ()))
            while stack:  # what it called belongs to this node, but for ops already another node's
                j = stack.pop()
                if covered[j]:
                    own_us -= rows[j][incl]
                    continue
                covered[j] = True
                taken += 1
                stack.extend(children.get(j, ()))
            covered[i] = True
            own_us = max(own_us, 0.0)
            if profiler_us_per_op is not None:
                own_us = max(own_us - taken * profiler_us_per_op[phase_id], PROFILER_FLOOR * own_us)
            node_ms[n] = own_us / 1e3
            matched_ms[phase] += own_us / 1e3
            pos = max(pos, best + 1)
    unmatched_ms: Counter = Counter()
    for i, r in enumerate(rows):
        if not covered[i] and r[cols["phase"]] >= 0 and r[self_col] > 0:
            unmatched_ms[names[i]] += r[self_col] / 1e3
    return Match(node_ms, matched_ms, total_ms, unmatched_nodes, unmatched_ms)


def match_dataset(folder, log=None) -> dict:
    """Match every profiled record of a dataset folder; the time-weighted matched share overall and per
    family, the least matched records and the ops whose time stayed unmatched."""
    from collections import defaultdict

    from gnn_ptp import dataset, profiles, records
    from gnn_ptp.trace import trace_step

    found = profiles.read_profiles(folder)
    rows, unmatched_ms, unmatched_nodes = [], Counter(), Counter()
    per_family: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    traces: dict[tuple, object] = {}  # one trace per configuration, however many profiles it has
    profiled = [r for r in records.iter_records(folder) if r.get("id") in found and r.get("status") == "ok"]
    for r in sorted(profiled, key=lambda r: r["key"]):
        p = found[r["id"]]
        hardware = r["env"]["hardware"]
        target = dataset.trace_target(hardware)
        trace_key = (r["key"], r["env"].get("torch"))
        if trace_key not in traces:
            try:
                traces = {trace_key: trace_step(dataset.step_config_of(r["config"], target,
                                                                       kernels=r["env"].get("torch")))}
            except Exception as e:  # a record that will not trace is reported, not matched
                traces = {trace_key: f"{type(e).__name__}: {e}"[:200]}
        traced = traces[trace_key]
        if isinstance(traced, str):
            rows.append({"key": r["key"], "spec": r["config"]["spec"], "precision": r["config"]["precision"],
                         "error": traced})
            continue
        m = match_profile(traced, p)
        unmatched_ms.update(m.unmatched_ms)
        unmatched_nodes.update(m.unmatched_nodes)
        total, matched = sum(m.total_ms.values()), sum(m.matched_ms.values())
        family = r.get("family") or "?"
        per_family[family][0] += matched
        per_family[family][1] += total
        rows.append({"key": r["key"], "spec": r["config"]["spec"], "precision": r["config"]["precision"],
                     "family": family, **m.to_dict()})
        if log:
            log(f"  {r['config']['spec']} {r['config']['precision']}: {m.matched_share:.1%}")
    matched = sum(v[0] for v in per_family.values())
    total = sum(v[1] for v in per_family.values())
    return {"records": len(rows), "matched_share": matched / total if total else None,
            "by_family": {f: v[0] / v[1] for f, v in sorted(per_family.items()) if v[1]},
            "worst": sorted((x for x in rows if "matched_share" in x), key=lambda x: x["matched_share"])[:5],
            "failed": [x for x in rows if "error" in x],
            "unmatched_ms": {k: round(v, 3) for k, v in unmatched_ms.most_common(12)},
            "unmatched_nodes": dict(unmatched_nodes.most_common(12))}


def format_match(result: dict) -> str:
    share = result["matched_share"]
    lines = [f"{result['records']} profiled records; device time matched to graph nodes: "
             + (f"{share:.1%}" if share is not None else "none")]
    lines.append("by family: " + ", ".join(f"{f} {s:.1%}" for f, s in result["by_family"].items()))
    for w in result["worst"]:
        lines.append(f"  least matched: {w['spec']} {w['precision']} {w['matched_share']:.1%} "
                     f"({w['nodes_matched']}/{w['nodes']} nodes)")
    lines.append("unmatched time by op (ms): " + ", ".join(f"{k} {v}" for k, v in result["unmatched_ms"].items()))
    if result["unmatched_nodes"]:
        lines.append("graph nodes without a profiled partner: "
                     + ", ".join(f"{k} {v}" for k, v in result["unmatched_nodes"].items()))
    for f in result["failed"]:
        lines.append(f"  not traced: {f['spec']} {f['precision']}: {f['error']}")
    return "\n".join(lines)
