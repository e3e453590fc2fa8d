"""How the depthwise convolutions of a CPU kind's steps compare with the same kernels measured apart, and what
pricing them from those measurements would do to its steps: a check, not a fit.

    python benchmarks/depthwise_probe_check.py --data datasets/cpu \
        --probes benchmarks/results/amd-epyc-family-25-model-17-depthwise-probes-small-2026-11-29.json

``--probes`` is ``benchmarks/depthwise_probes.py --grid small --layout both`` run on the same CPU kind (one
thread). Its table (``gnn_ptp/depthwise_table.py``, as the prior reads a descriptor's probes) prices a
depthwise convolution of given dtype, direction and input layout (contiguous or channels-last,
``ops.CHANNELS_LAST``) by multilinear interpolation of log time over log batch, channels, pixels and taps
between the grid's points (clamped at its edges). Printed, per family
with depthwise convolutions and per input layout: the profiled in-step time of those kernels summed, over
the shipped depthwise law's price (``prior.Profile.depthwise``) and over the table's; then each family's
step MAPE with the shipped section (``kind_profile``, as ``prior_error_sources.py``) and with the
depthwise kernels of a layout priced from the table instead (``--table-layout``, default channels_last),
everything else unchanged. The shipped section was fitted to every family but three, so this is a
decomposition, not a held-out score.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import depthwise_table, ops, prior, prior_fit  # noqa: E402

def table_seconds(table: depthwise_table.Table, s, layout_of: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per node of sample ``s`` its table price (NaN for a node that is no depthwise convolution, or not of
    ``layout_of`` where given), and each node's layout (True: channels-last)."""
    shapes = prior.depthwise_shapes(s.x, s.x_cat)
    cl = prior.channels_last(s.gemm_layout)
    backward = s.x_cat[:, 3] == prior.BACKWARD_PHASE
    dtypes = [ops.DTYPES[d] for d in s.x_cat[:, 2].tolist()]
    out = torch.full((s.x.shape[0],), float("nan"), dtype=torch.float64)
    for layout, m in (("channels_last", cl), ("contiguous", ~cl)):
        if layout_of is None or layout == layout_of:
            by_table = table.priced(shapes, backward, dtypes, m, layout)
            out = torch.where(torch.isnan(by_table), out, by_table)
    return out, cl


def main(argv=None) -> int:
    from prior_error_sources import kind_profile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a CPU dataset folder with per-op profiles")
    ap.add_argument("--probes", type=Path, required=True, help="depthwise_probes.py --grid small --layout both")
    ap.add_argument("--table-layout", choices=("channels_last", "contiguous", "both"), default="channels_last",
                    help="whose depthwise convolutions the table prices in the step column")
    args = ap.parse_args(argv)
    probes = json.loads(args.probes.read_text())
    table = depthwise_table.Table(probes["rows"])
    hw, samples, node_seconds = prior_fit.load_profiled(args.data)
    profile = kind_profile(args.data, hw)
    print(f"{args.data}: {len(samples)} configurations; probes {args.probes.name} ({probes['env']['cpu_kind']}, "
          f"{probes['env']['date']}); table prices {args.table_layout} depthwise convolutions")
    sums = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    steps = defaultdict(list)
    which = None if args.table_layout == "both" else args.table_layout
    for s in samples:
        priced = prior.node_seconds(s.x, s.x_cat, profile, getattr(s, "fresh_bytes", None), s.gemm_layout)
        by_table, cl = table_seconds(table, s, None)
        per_node = node_seconds.get(s.key)
        measured = prior_fit.measured_node_seconds(s, per_node) if per_node else None
        if measured is not None:
            ok = ~torch.isnan(by_table) & ~torch.isnan(measured) & (measured > 0)
            for layout, m in (("channels_last", ok & cl), ("contiguous", ok & ~cl)):
                if bool(m.any()):
                    cell = sums[(s.family, layout)]
                    cell[0] += float(measured[m].sum())
                    cell[1] += float(priced[m].sum())
                    cell[2] += float(by_table[m].sum())
                    cell[3] += int(m.sum())
        chosen, _ = table_seconds(table, s, which)
        swapped = torch.where(torch.isnan(chosen), priced,
                              torch.maximum(chosen, torch.full_like(chosen, profile.launch_floor_s)))
        true = float(s.y[0, 3].double().exp())
        grad = getattr(s, "grad_bytes", None)
        steps[s.family].append((float(prior.graph_phase_ms(priced, s.phase, profile, grad).sum()) / true,
                                float(prior.graph_phase_ms(swapped, s.phase, profile, grad).sum()) / true))
    print("\ndepthwise kernels in the profiled steps: measured sum over the shipped law's / over the probe table's")
    print(f"{'family':<14}{'layout':<15}{'n':>6}{'measured ms':>13}{'law / meas':>12}{'table / meas':>14}")
    for (family, layout), (m, p, t, n) in sorted(sums.items()):
        print(f"{family:<14}{layout:<15}{n:>6}{m * 1e3:>13.1f}{p / m:>12.2f}{t / m:>14.2f}")
    print("\nstep MAPE (every configuration of the family): shipped section / its depthwise kernels from the table")
    both = []
    for family, rs in sorted(steps.items()):
        r = np.array(rs)
        a, b = np.mean(np.abs(r[:, 0] - 1)) * 100, np.mean(np.abs(r[:, 1] - 1)) * 100
        if abs(a - b) > 1e-9:
            print(f"  {family:<20}{len(rs):>4}  {a:6.1f} % -> {b:6.1f} %   (median ratio {np.median(r[:, 0]):.2f} -> "
                  f"{np.median(r[:, 1]):.2f})")
        both.append(r)
    r = np.concatenate(both)
    print(f"  {'all':<20}{len(r):>4}  {np.mean(np.abs(r[:, 0] - 1)) * 100:6.1f} % -> "
          f"{np.mean(np.abs(r[:, 1] - 1)) * 100:6.1f} %")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
