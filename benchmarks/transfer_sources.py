"""Where a prior moved from one CPU kind to another goes wrong, kernel category by kernel category.

    python benchmarks/transfer_sources.py --source datasets/cpu \\
        --target datasets/cpu-intel-r-xeon-r-processor-family-6-model-167

Both folders need per-op profiles of the same configurations (``collect --profile all``). For every kernel
category and compute dtype (``matmul:bf16``, ``elementwise:fp32``, ...) it prints, over the configurations
both kinds profiled and the kernels the profiles matched:

- **share**: the category's part of the source kind's measured step time;
- **measured target / source**: how much longer the category's kernels took on the target (sum over the
  configurations, and the median of the per-configuration ratios);
- **prior target / source**: what the source kind's prior, moved to the target by the descriptors
  (``descriptor.transfer``), says that ratio is; with ``--section`` another calibration section's curves,
  with ``--mode split`` the split transfer (``descriptor.TRANSFER_MODES``);
- **rates' time ratio**: source rate / target rate of the rate that moves it (``descriptor.transfer_ratios``:
  the GEMM rate of the dtype, or element-wise; the bandwidth beside it; the ceilings, or the step probes
  where both kinds have them).

It reads measured times of both kinds, so it explains the cross-hardware protocol's error; it is no score
(``gnn-ptp evaluate --protocol hardware`` gives those, without any record of the test kind).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import dataset, descriptor, ops, prior, prior_fit  # noqa: E402
from gnn_ptp.errors import UserError, run_script  # noqa: E402


def category_sums(data: str, profile: prior.Profile) -> dict[str, dict[str, list[float]]]:
    """Per configuration key: per "category:dtype", [measured s, prior s] over the profile-matched kernels,
    and "(step)": [measured step s, prior's step s]."""
    _, samples, node_seconds = prior_fit.load_profiled(data)
    out = {}
    for s in samples:
        measured = prior_fit.measured_node_seconds(s, node_seconds[s.key]) if s.key in node_seconds else None
        if measured is None:
            continue
        predicted = prior.node_seconds(s.x, s.x_cat, profile, getattr(s, "fresh_bytes", None),
                                       getattr(s, "gemm_layout", None))
        matched = ~torch.isnan(measured) & (measured > 0)
        cells = defaultdict(lambda: [0.0, 0.0])
        for i in torch.nonzero(matched).flatten().tolist():
            cell = cells[f"{ops.CATEGORIES[int(s.x_cat[i, 1])]}:{ops.DTYPES[int(s.x_cat[i, 2])]}"]
            cell[0] += float(measured[i])
            cell[1] += float(predicted[i])
        step = prior.graph_phase_ms(predicted, s.phase, profile, getattr(s, "grad_bytes", None)).sum() / 1e3
        cells["(step)"] = [float(s.y[0, :3].double().exp().sum()) / 1e3, float(step)]
        out[s.key] = dict(cells)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default="datasets/cpu", help="dataset folder of the kind the prior comes from")
    ap.add_argument("--target", required=True, help="dataset folder of the kind it is moved to")
    ap.add_argument("--section", help="calibration section of the curves (default: the source kind's own)")
    ap.add_argument("--mode", default=descriptor.CPU_TRANSFER,
                    help=f"how the prior moves to the target (allowed: {', '.join(descriptor.TRANSFER_MODES)}; "
                         f"default {descriptor.CPU_TRANSFER})")
    ap.add_argument("--min-share", type=float, default=0.5, help="leave out categories under this %% of the "
                                                                    "source's step time (default 0.5)")
    args = ap.parse_args(argv)
    measured = [dataset.measured_configs(d) for d in (args.source, args.target)]  # refuses an empty folder
    if not {m.key for m in measured[0]} & {m.key for m in measured[1]}:
        raise UserError(f"--source {args.source} and --target {args.target} share no configuration (the "
                        "same grid measured on two kinds is what this compares)")
    src, tgt = [descriptor.for_env(configs[0].env) for configs in measured]
    section = args.section or src.curves_section()
    if args.mode not in descriptor.TRANSFER_MODES:
        raise UserError(f"--mode {args.mode}: allowed: {', '.join(descriptor.TRANSFER_MODES)}")
    own = src.profile(section)
    moved = descriptor.transfer(own, src, tgt, args.mode)
    sums = [category_sums(args.source, own), category_sums(args.target, moved)]
    common = sorted(set(sums[0]) & set(sums[1]))
    if not common:
        raise UserError(f"--source {args.source} and --target {args.target} share no profiled configuration")
    print(f"{src.name} -> {tgt.name}: {len(common)} configurations profiled on both; curves of section "
          f"{section!r} (fitted on {descriptor.calibrated_descriptor(section).name}), moved by {args.mode!r}\n")
    totals = defaultdict(lambda: np.zeros(4))  # measured src, measured tgt, prior src, prior tgt
    ratios = defaultdict(list)
    moves = descriptor.transfer_ratios(src, tgt)  # target over source, what the prior is moved by
    for key in common:
        a, b = sums[0][key], sums[1][key]
        for cat in set(a) & set(b):
            if a[cat][0] > 0 and b[cat][0] > 0:
                totals[cat] += (a[cat][0], b[cat][0], a[cat][1], b[cat][1])
                ratios[cat].append(b[cat][0] / a[cat][0])
    step = totals["(step)"][0]
    print(f"{'category:dtype':<22}{'share':>7}{'measured tgt/src':>18}{'median':>8}{'prior tgt/src':>15}"
          f"{'prior/measured':>16}   rates' time ratio tgt/src")
    rows = sorted(totals.items(), key=lambda kv: (kv[0] != "(step)", -kv[1][0]))
    for cat, (ms, mt, ps, pt) in rows:
        share = ms / step * 100
        if cat != "(step)" and share < args.min_share:
            continue
        measured, moved = mt / ms, pt / ps
        if cat == "(step)":
            rate = "all of them"
        else:
            name, dtype = cat.split(":")
            gemm = name in ops.TENSOR_CORE_CATEGORIES and dtype in moves
            rate = (f"{dtype} GEMM" if gemm else "element-wise") + f" {1 / moves[dtype if gemm else 'vector']:.2f}"
            rate += f" (time), bandwidth {1 / moves['memory']:.2f}"
        print(f"{cat:<22}{share:>6.1f}%{measured:>18.2f}{np.median(ratios[cat]):>8.2f}{moved:>15.2f}"
              f"{moved / measured:>16.2f}   {rate}")
    print("\n(time ratios: above 1, the target kind is slower; the rates' ratio is the time ratio the rate that moves"
          " the prior alone implies: descriptor.transfer_ratios, the ceilings or, where both kinds have them, the"
          " step probes)")
    return 0


if __name__ == "__main__":
    run_script(main)
