"""``gnn-ptp predict --explain``: where a predicted step's time goes, op by op.

The per-node times of the prediction (the GNN's per-kernel head, or the physical prior's per-kernel times
in the analytic mode) are summed per op name and phase. One precision class prints a table of the top ops
with their forward, backward and optimizer time and their share of the step; several classes print one
row per op with its time and share in each class, so a precision change reads op by op.
"""

from __future__ import annotations

import torch

from gnn_ptp import ops

PHASE_NAMES = ("forward", "backward", "optimizer")


def op_breakdown(log_node_ms: torch.Tensor, tensors: dict) -> list[dict]:
    """Every op of the step with its predicted ms per phase, in all, and its share of the step, largest
    first."""
    ms = log_node_ms.double().exp()
    per_op: dict[str, list[float]] = {}
    for op_id, phase, t in zip(tensors["x_cat"][:, 0].tolist(), tensors["phase"].tolist(), ms.tolist()):
        per_op.setdefault(ops.VOCAB[op_id], [0.0, 0.0, 0.0])[phase] += t
    total = float(ms.sum()) or 1.0
    rows = [{"op": op, "category": ops.category(op),
             **{f"{p}_ms": v[i] for i, p in enumerate(PHASE_NAMES)}, "ms": sum(v), "share": sum(v) / total}
            for op, v in per_op.items()]
    return sorted(rows, key=lambda r: -r["ms"])


def _ms(ms: float) -> str:
    if ms <= 0:
        return "-"
    return f"{ms:.2f}ms" if ms < 10 else (f"{ms:.1f}ms" if ms < 1e4 else f"{ms / 1e3:.1f}s")


def source_line(pred, meta: dict | None = None) -> str:
    """Where the per-op times come from, said plainly."""
    if pred.source == "analytic-prior":
        return (f"per-op times from the calibrated physical prior (ANALYTIC ESTIMATE: no {pred.hardware} "
                f"checkpoint yet; per-kernel roofline with fitted efficiency curves, not measured)")
    from gnn_ptp.node_labels import labelled_meta

    return f"per-op times from the per-node head of {pred.checkpoint}, {labelled_meta(meta or {})}"


def format_explain(preds: list, top: int = 8, meta: dict | None = None) -> str:
    """The top ops by predicted time (see the module docstring)."""
    rows = [p for p in preds if p.op_breakdown]
    if not rows:
        return "explain: this checkpoint has no per-node times (readout pool): no per-op breakdown"
    lines = [source_line(rows[0], meta)]
    if len(rows) == 1:
        p = rows[0]
        lines.append(f"top {min(top, len(p.op_breakdown))} ops by predicted time ({p.precision}; share of the "
                     f"step's {_ms(sum(r['ms'] for r in p.op_breakdown))} of kernel time)")
        lines.append(f"{'op':<28}{'forward':>10}{'backward':>10}{'optimizer':>10}{'total':>10}{'share':>8}")
        for r in p.op_breakdown[:top]:
            lines.append(f"{r['op'][:27]:<28}{_ms(r['forward_ms']):>10}{_ms(r['backward_ms']):>10}"
                         f"{_ms(r['optimizer_ms']):>10}{_ms(r['ms']):>10}{r['share']:>8.1%}")
        rest = p.op_breakdown[top:]
        if rest:
            lines.append(f"{f'{len(rest)} other ops':<28}{'':>30}{_ms(sum(r['ms'] for r in rest)):>10}"
                         f"{sum(r['share'] for r in rest):>8.1%}")
        return "\n".join(lines)
    # several classes: the ops that are large in any class, time and share in each
    largest: dict[str, float] = {}
    for p in rows:
        for r in p.op_breakdown:
            largest[r["op"]] = max(largest.get(r["op"], 0.0), r["share"])
    chosen = sorted(largest, key=lambda op: -largest[op])[:top]
    lines.append(f"top {len(chosen)} ops by predicted share in any class: time (share of the step) per precision "
                 "class")
    width = 17
    lines.append(f"{'op':<24}" + "".join(f"{p.precision:>{width}}" for p in rows))
    for op in chosen:
        cells = []
        for p in rows:
            r = next((r for r in p.op_breakdown if r["op"] == op), None)
            cells.append(f"{_ms(r['ms'])} {r['share']:>4.0%}" if r else "-")
        lines.append(f"{op[:23]:<24}" + "".join(f"{c:>{width}}" for c in cells))
    return "\n".join(lines)
