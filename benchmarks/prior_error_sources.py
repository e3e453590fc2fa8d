"""Where the physical prior's step error comes from, on a dataset folder with per-op profiles.

    python benchmarks/prior_error_sources.py --data datasets/h200

A CPU folder is priced with its own kind's section (``kind_profile``: the descriptor of its records' CPU),
not the reference CPU's.

Every profiled configuration is priced twice through the same step model (``prior.graph_phase_ms``: one
launch queue through forward, backward and optimizer, with the calibration's host costs):

- **prior**: every kernel's device time from the prior's curves (what ``predict --analytic`` does);
- **measured kernels**: every kernel the profile matched (``match.py``) at its measured device time, the
  rest (unmatched) at the prior's.

The gap between the two columns is the part of the error the per-kernel curves cause; what is left in the
second column belongs to the step model (host costs, the queue, synchronisations it does not know) and to
the kernels the profile did not match. The shipped calibration has seen most families' kernels and steps,
so this is a decomposition, not a held-out score (``calibrate_prior.py --lofo`` and ``evaluate --protocol``
give those). Also printed: per family, the median of the kernels' device time (measured, or the prior's
where unmatched) over the measured step (low: the host sets the pace), and the kernel categories that hold the most time with the prior's sum over the measured
one; per precision class, the median predicted / measured time of each phase.

    python benchmarks/prior_error_sources.py --data datasets/cpu-amd-epyc-family-25-model-1 --gemm-layouts

adds the two-operand GEMMs (matmuls) by compute dtype, phase and operand layout (``ops.GEMM_LAYOUTS``: a
linear layer's forward is ``nt``, its input gradient ``nn``, its weight gradient ``tn``): each one's share
of the matched kernel time and the prior's sum over the measured one, over every family and per family,
beside all layouts together. A prior that prices each layout off but their sum right errs per kernel and
not per step.

    python benchmarks/prior_error_sources.py --data datasets/cpu-amd-epyc-family-26-model-2 --size-fold 0

decomposes the size protocol's fold instead (``evaluate --protocol size``, the seed's split): the kind's
prior refitted to the fold's training half as the protocol refits it (``protocol.prior_refit`` with the
shipped section's options, fastest-record labels with ``--labels fastest``), then the test steps (>= 4x the
training half's largest) priced both ways; and the dense convolutions and matmuls of the training half and
of the test steps by FLOPs decade: their achieved rate and the refitted prior's sum over the measured one.
Where the measured-kernels column is far below the prior's, the size error is the curves' extrapolation.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import dataset, ops, prior, prior_fit  # noqa: E402
from gnn_ptp.errors import UserError, run_script  # noqa: E402

PHASES = ("forward", "backward", "optimizer")


def decompose(samples: list, node_seconds: dict, profile: prior.Profile) -> list[dict]:
    """Per profiled sample: phase ms of the prior, of the measured kernels, measured; kernel sums."""
    rows = []
    for s in samples:
        if s.key not in node_seconds:
            continue
        measured = prior_fit.measured_node_seconds(s, node_seconds[s.key])
        if measured is None:
            continue
        predicted = prior.node_seconds(s.x, s.x_cat, profile, getattr(s, "fresh_bytes", None),
                                       getattr(s, "gemm_layout", None))
        matched = ~torch.isnan(measured) & (measured > 0)
        hybrid = torch.where(matched, measured, predicted)
        grad_bytes = getattr(s, "grad_bytes", None)
        category = defaultdict(lambda: [0.0, 0.0])
        depthwise = ~torch.isnan(prior.depthwise_shapes(s.x, s.x_cat)[:, 0])
        for c in s.x_cat[matched, 1].unique().tolist():
            for p in range(3):
                m = matched & (s.x_cat[:, 1] == c) & (s.phase == p)
                # depthwise-like convolutions apart from the dense ones (their own law, prior.depthwise_shapes)
                for name, pick in ((ops.CATEGORIES[c], m & ~depthwise), ("dwconv", m & depthwise)):
                    if bool(pick.any()):
                        cell = category[f"{name}/{PHASES[p][0]}"]
                        cell[0] += float(measured[pick].sum())
                        cell[1] += float(predicted[pick].sum())
        rows.append({"family": s.family, "precision": s.precision,
                     "prior": prior.graph_phase_ms(predicted, s.phase, profile, grad_bytes).numpy(),
                     "kernels": prior.graph_phase_ms(hybrid, s.phase, profile, grad_bytes).numpy(),
                     "true": s.y[0].double().exp().numpy()[:3],
                     "kernel_ms": float(hybrid.sum()) * 1e3, "category": dict(category)})
    return rows


def _ape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / true - 1)) * 100)


def print_tables(rows: list[dict], top: int = 3) -> None:
    """Per family (and all): step and per-phase MAPE of the prior and of the measured kernels, the kernels'
    share of the step, and the ``top`` kernel categories by measured time (share of the step, prior /
    measured); per precision class the median predicted / measured of each phase."""
    groups = defaultdict(list)
    for r in rows:
        groups[r["family"]].append(r)
    print(f"{'family':<20}{'n':>5}  {'step MAPE':>22}  {'per phase MAPE, prior / measured kernels':>48}"
          f"  {'kernels':>8}  top kernel categories: share of step, prior / measured")
    print(f"{'':<20}{'':>5}  {'prior':>10}  {'kernels':>10}  {'forward':>14}  {'backward':>14}  "
          f"{'optimizer':>14}  {'/ step':>8}")
    for name in [*sorted(groups), "all"]:
        rs = rows if name == "all" else groups[name]
        P, K, T = (np.array([r[k] for r in rs]) for k in ("prior", "kernels", "true"))
        phases = "  ".join(f"{_ape(P[:, i], T[:, i]):5.1f} / {_ape(K[:, i], T[:, i]):5.1f}" for i in range(3))
        share = np.median([r["kernel_ms"] / r["true"].sum() for r in rs])
        line = (f"{name:<20}{len(rs):>5}  {_ape(P.sum(1), T.sum(1)):9.1f}%  {_ape(K.sum(1), T.sum(1)):9.1f}%  "
                f"{phases}  {share:8.2f}")
        if name != "all":
            total = sum(r["true"].sum() for r in rs) * 1e-3
            cats = defaultdict(lambda: [0.0, 0.0])
            for r in rs:
                for c, (m, p) in r["category"].items():
                    cats[c][0] += m
                    cats[c][1] += p
            most = sorted(cats.items(), key=lambda kv: -kv[1][0])[:top]
            line += "  " + ", ".join(f"{c} {m / total * 100:.0f}% x{p / m:.2f}" for c, (m, p) in most)
        print(line)
    print("\nmedian predicted / measured per phase (forward, backward, optimizer), by precision class:")
    by_precision = defaultdict(list)
    for r in rows:
        by_precision[r["precision"]].append(r)
    for name, rs in sorted(by_precision.items()):
        P, K, T = (np.array([r[k] for r in rs]) for k in ("prior", "kernels", "true"))
        fmt = lambda a: " ".join(f"{v:.2f}" for v in np.median(a / T, 0))  # noqa: E731
        print(f"  {name:<14} n {len(rs):4d}   prior {fmt(P)}   measured kernels {fmt(K)}")


def layout_sums(samples: list, node_seconds: dict, profile: prior.Profile) -> dict:
    """{(family, "dtype/phase", layout): [measured s, prior s]} over the matched two-operand GEMMs
    (layout "all": every layout of that dtype and phase together)."""
    sums = defaultdict(lambda: [0.0, 0.0])
    matmul = ops.CATEGORIES.index("matmul")
    for s in samples:
        layout = getattr(s, "gemm_layout", None)
        measured = prior_fit.measured_node_seconds(s, node_seconds[s.key]) if s.key in node_seconds else None
        if measured is None or layout is None:
            continue
        predicted = prior.node_seconds(s.x, s.x_cat, profile, getattr(s, "fresh_bytes", None), layout)
        layout = layout.reshape(-1).long()
        keep = ~torch.isnan(measured) & (measured > 0) & (s.x_cat[:, 1] == matmul) & (layout > 0)
        for i in keep.nonzero().reshape(-1).tolist():
            where = f"{ops.DTYPES[int(s.x_cat[i, 2])]}/{PHASES[int(s.phase[i])][0]}"
            for key in ((s.family, where, ops.GEMM_LAYOUTS[int(layout[i])]), (s.family, where, "all")):
                sums[key][0] += float(measured[i])
                sums[key][1] += float(predicted[i])
    return dict(sums)


def print_layouts(sums: dict, total_s: float) -> None:
    print("\ntwo-operand GEMMs by dtype / phase and operand layout: share of the matched kernel time, "
          "prior / measured (sum)")
    pooled = defaultdict(lambda: [0.0, 0.0])
    for (_, where, layout), (m, p) in sums.items():
        pooled[(where, layout)][0] += m
        pooled[(where, layout)][1] += p
    for (where, layout), (m, p) in sorted(pooled.items(), key=lambda kv: (kv[0][0], kv[0][1] != "all", -kv[1][0])):
        print(f"  {where:<10} {layout:<4} {m / total_s * 100:6.1f}%  x{p / m:5.2f}")
    print("\nper family, bf16 matmuls: prior / measured of all layouts together, then each layout (share of "
          "the family's bf16 matmul time)")
    for family in sorted({f for f, _, _ in sums}):
        cells = {(w, lay): v for (f, w, lay), v in sums.items() if f == family and w.startswith("bf16/")}
        m_all = sum(v[0] for (w, lay), v in cells.items() if lay == "all")
        p_all = sum(v[1] for (w, lay), v in cells.items() if lay == "all")
        if m_all <= 0:
            continue
        each = sorted(((w, lay), v) for (w, lay), v in cells.items() if lay != "all")
        print(f"  {family:<20} x{p_all / m_all:5.2f}   " + ", ".join(
            f"{w[-1]} {lay} x{p / m:.2f} ({m / m_all * 100:.0f}%)" for (w, lay), (m, p) in each if m / m_all >= 0.02))


def _fold_data(data: str, labels: str, profiler_cost: bool = False):
    """What a protocol fold of ``data`` is decomposed from: its samples (``labels``), the per-node measured
    seconds its prior is refitted to with its shipped section's options (``protocol.prior_refit``; the
    profiler's cost off them with ``profiler_cost``) and its hardware name."""
    from gnn_ptp import protocol

    quiet = lambda _: None  # noqa: E731
    _, samples, _ = protocol.load([data], True, quiet, label=labels)
    refit = protocol.prior_refit([data], quiet, as_shipped=True, profiler_cost=profiler_cost)
    if refit is None:
        raise UserError(f"--data {data}: no per-op profiles, nothing to decompose")
    return samples, refit, samples[0].hardware_name


def size_fold(data: str, seed: int, labels: str = "mean", fresh: str | None = None) -> None:
    """The size protocol's fold of ``seed`` on ``data``: the prior refitted to its training half as the
    protocol does, its test steps decomposed (``print_tables``), and the GEMM-like kernels by FLOPs decade.
    ``fresh``: a profiled folder of configurations measured apart (``evaluate --fresh-data``): its steps with
    at least ``SIZE_FACTOR`` x the training half's largest, decomposed the same way with the same refitted prior."""
    from gnn_ptp import protocol

    samples, refit, name = _fold_data(data, labels)
    parts = protocol.size_split(samples, seed)
    top = parts.pop("train_max_flops")
    fit_on = parts["train"] + parts["val"]
    profile = refit.fit(name, fit_on)
    print(f"{data}: size fold seed {seed} ({labels} labels): the prior refitted to {len(fit_on)} steps "
          f"(<= {top:.3g} FLOPs), {len(parts['test'])} test steps (>= {protocol.SIZE_FACTOR:g}x)\n")
    print_tables(decompose(parts["test"], refit.seconds[name], profile))
    tables = [("train", fit_on, refit.seconds[name]), ("test", parts["test"], refit.seconds[name])]
    if fresh is not None:
        theirs, fresh_refit, fresh_name = _fold_data(fresh, labels)
        if fresh_name != name:
            raise UserError(f"--fresh {fresh}: its steps are of {fresh_name}, --data's of {name}")
        held = {s.key for s in samples}
        tested = [s for s in protocol.fresh_tests(theirs, top) if s.key not in held]
        print(f"\n{fresh}: {len(tested)} fresh steps (>= {protocol.SIZE_FACTOR:g}x, none in {data}) priced by the "
              "same refitted prior\n")
        print_tables(decompose(tested, fresh_refit.seconds[name], profile), top=4)
        tables.append(("fresh", tested, fresh_refit.seconds[name]))
    print("\ndense convolutions, matmuls and depthwise convolutions by FLOPs decade: achieved GFLOP/s, refitted "
          "prior / measured (sum)")
    for label, part, seconds_by_key in tables:
        rows = prior_fit.kernel_rows(part, seconds_by_key)
        predicted = prior_fit._prior_seconds(rows, profile).numpy()
        flops, seconds = rows.flops.numpy(), rows.seconds.numpy()
        dense = np.ones(len(rows), dtype=bool) if rows.depthwise is None else torch.isnan(rows.depthwise[:, 0]).numpy()
        decade = np.floor(np.log10(np.maximum(flops, 1.0)))
        for category in ("conv", "matmul", "dwconv"):  # dwconv: the depthwise-like convolutions (their own law)
            for dtype in sorted(set(rows.dtype)):
                pick = (~dense if category == "dwconv" else dense) & np.array(
                    [c == category.removeprefix("dw") and d == dtype for c, d in zip(rows.category, rows.dtype)])
                cells = []
                for e in sorted(set(decade[pick])):
                    m = pick & (decade == e)
                    if m.sum() >= 3:
                        cells.append(f"1e{int(e)} {flops[m].sum() / seconds[m].sum() / 1e9:.0f} "
                                     f"x{predicted[m].sum() / seconds[m].sum():.2f} (n {int(m.sum())})")
                if cells:
                    print(f"  {label:<5} {category:<6} {dtype:<5} " + ", ".join(cells))


def lofo_fold(data: str, family: str, labels: str = "mean", profiler_cost: bool = False) -> None:
    """The leave-one-family-out fold of ``family`` on ``data`` as the protocol's prior sees it
    (``evaluate --protocol lofo``): the kind's prior refitted to every other family's steps with its shipped
    section's options (and the profiler's cost off the kernels with ``profiler_cost``), then ``family``'s
    steps decomposed (``print_tables``) with every kernel category, by measured time."""
    families = sorted({m.family for m in dataset.measured_configs(data)})
    if family not in families:  # from the records alone, before any graph is traced
        raise UserError(f"--lofo-fold {family}: not a family of {data}; allowed: {', '.join(families) or 'none'}")
    samples, refit, name = _fold_data(data, labels, profiler_cost)
    fit_on = [s for s in samples if s.family != family]
    test = [s for s in samples if s.family == family]
    profile = refit.fit(name, fit_on)
    print(f"{data}: {family} left out ({labels} labels{', profiler cost off the kernels' if profiler_cost else ''}): "
          f"the prior refitted to {len(fit_on)} steps of the other families, {len(test)} test steps")
    if profile.host_issue_s:
        print("host cost per issued kernel + per phase: " + ", ".join(
            f"{p} {k * 1e6:.1f} us + {f * 1e6:.0f} us"
            for p, k, f in zip(PHASES, profile.host_issue_s, profile.host_fixed_s or (0.0,) * 3)))
    print()
    print_tables(decompose(test, refit.seconds[name], profile), top=40)


def kind_profile(data, hw) -> prior.Profile:
    """The prior of the hardware kind ``data``'s records were measured on: a CPU kind's own section (its
    descriptor's, e.g. ``cpu-amd-epyc-family-26-model-2``), not the reference CPU's that the ``cpu``
    hardware name gives; a GPU's calibrated profile."""
    from gnn_ptp import descriptor

    if hw.kind != "cpu":
        return prior.get_profile(hw)
    env = dataset.measured_configs(data)[0].env or {"hardware": "cpu"}
    return descriptor.for_env(env).profile()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="datasets/h200")
    ap.add_argument("--gemm-layouts", action="store_true",
                    help="also the matmuls by dtype, phase and operand layout, over all families and per family")
    ap.add_argument("--size-fold", type=int, metavar="SEED",
                    help="decompose the size protocol's fold of this seed (the prior refitted to its training half)")
    ap.add_argument("--fresh", metavar="DIR",
                    help="with --size-fold: also decompose this profiled folder's steps measured apart (>= 4x the "
                         "training half's largest) with the fold's refitted prior")
    ap.add_argument("--labels", default=dataset.LABEL_STATS[0], choices=dataset.LABEL_STATS,
                    help="with --size-fold or --lofo-fold: how repeated configurations are labelled (evaluate --labels)")
    ap.add_argument("--lofo-fold", metavar="FAMILY",
                    help="decompose the protocol's leave-one-family-out fold of this family (the prior refitted "
                         "to every other family)")
    ap.add_argument("--profiler-cost", action="store_true",
                    help="with --lofo-fold: the refit's node seconds less the profiler's cost (evaluate --profiler-cost)")
    args = ap.parse_args()
    if args.lofo_fold is not None:
        lofo_fold(args.data, args.lofo_fold, args.labels, args.profiler_cost)
        return
    if args.size_fold is not None:
        size_fold(args.data, args.size_fold, args.labels, args.fresh)
        return
    hw, samples, node_seconds = prior_fit.load_profiled(args.data)
    profile = kind_profile(args.data, hw)
    rows = decompose(samples, node_seconds, profile)
    print(f"{args.data}: {len(rows)} profiled configurations of {len(samples)} on {hw.description}")
    print(f"calibration: {profile.source}\n")
    print_tables(rows)
    if args.gemm_layouts:
        total_s = sum(sum(m for m, _ in r["category"].values()) for r in rows)
        print_layouts(layout_sums(samples, node_seconds, profile), total_s)


if __name__ == "__main__":
    run_script(main)
