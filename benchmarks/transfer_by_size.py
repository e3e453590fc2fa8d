"""One CPU kind's measured kernels moved onto another by the step probes, one number per group or by size.

    python benchmarks/transfer_by_size.py --data datasets/cpu \\
        datasets/cpu-intel-r-xeon-r-processor-family-6-model-167 datasets/cpu-amd-epyc-family-25-model-1

For every ordered pair of the folders whose kinds measured the same step probes (``descriptor.probes_shared``),
each configuration profiled on both: the source kind's measured per-node seconds (fastest-record labels'
profiles, ``prior_fit.load_profiled``) divided by the target's speed-up under a rule, summed over the nodes both
profiles matched, against the target's measured sum; MAPE over the configurations, per rule:

- ``group``: one speed-up per probe group (``descriptor.transfer_ratios``, how ``transfer`` moves a prior between
  such kinds by ``split``): a GEMM-like kernel (attention too) by its dtype's GEMM probes, every other kernel by
  the element-wise probes;
- ``gemm-size``: the GEMM-like kernels (attention not) by their FLOPs (``descriptor.sized_move``'s lines), the
  rest as ``group``;
- ``sized`` at each ``--cache-mib``: ``prior.SizedMove.speedup`` itself, what ``--transfer-mode sized`` moves a
  prior by.

No prior enters: the source kind's kernels are measured, so this isolates how a rule moves time between kinds from
how well a prior prices the source. It reads both kinds' measured times: it explains, it is no score (``gnn-ptp
evaluate --protocol hardware`` scores without any record of the test kind).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import dataset, descriptor, ops, prior, prior_fit  # noqa: E402
from gnn_ptp.errors import UserError, run_script  # noqa: E402


def measured_kernels(folder: str) -> dict[str, tuple]:
    """Per configuration key: (x, x_cat, measured per-node seconds, NaN where unmatched)."""
    _, samples, node_seconds = prior_fit.load_profiled(folder, label="fastest")
    out = {}
    for s in samples:
        if s.key in node_seconds:
            measured = prior_fit.measured_node_seconds(s, node_seconds[s.key])
            if measured is not None:
                out[s.key] = (s.x, s.x_cat, measured.double())
    return out


def group_speedup(x: torch.Tensor, x_cat: torch.Tensor, ratios: dict[str, float]) -> torch.Tensor:
    """``group``'s speed-up per node: its dtype's GEMM ratio for a GEMM-like kernel, the element-wise one else."""
    out = torch.full((x.shape[0],), ratios["vector"], dtype=torch.float64)
    gemm = torch.zeros_like(out, dtype=torch.bool)
    for c in prior.GEMM_CATEGORIES:
        gemm |= x_cat[:, 1] == c
    for d in set(x_cat[gemm, 2].tolist()):
        rows = gemm & (x_cat[:, 2] == d)
        out[rows] = ratios.get(ops.DTYPES[d], ratios["fp32"])
    return out


def rules(source: descriptor.Descriptor, target: descriptor.Descriptor, cache_mib: list[float]) -> dict:
    """Rule name -> function (x, x_cat) -> per-node speed-up of ``target`` over ``source``."""
    ratios = descriptor.transfer_ratios(source, target)
    sized = descriptor.sized_move(source, target)
    attention = ops.CATEGORIES.index("attention")

    def gemm_size(x, x_cat):
        by_size = replace(sized, in_cache=ratios["vector"], bandwidth=ratios["vector"]).speedup(x, x_cat)
        return torch.where(x_cat[:, 1] == attention, group_speedup(x, x_cat, ratios), by_size)

    out = {"group": lambda x, x_cat: group_speedup(x, x_cat, ratios), "gemm-size": gemm_size}
    for mib in cache_mib:
        out[f"sized {mib:g} MiB"] = replace(sized, cache_bytes=mib * 2 ** 20).speedup
    return out


def pair_mape(source_kernels: dict, target_kernels: dict, speedups: dict) -> tuple[int, dict[str, float]]:
    """(configurations compared, MAPE % per rule) of the moved kernel sums against the target's."""
    errors = {name: [] for name in speedups}
    for key in sorted(set(source_kernels) & set(target_kernels)):
        x, x_cat, src = source_kernels[key]
        tgt = target_kernels[key][2]
        if tgt.numel() != src.numel():
            continue
        both = ~torch.isnan(src) & ~torch.isnan(tgt) & (src > 0) & (tgt > 0)
        if not bool(both.any()):
            continue
        measured = float(tgt[both].sum())
        for name, speedup in speedups.items():
            moved = float((src / speedup(x, x_cat))[both].sum())
            errors[name].append(abs(moved / measured - 1.0))
    n = len(next(iter(errors.values()))) if errors else 0
    return n, {name: 100.0 * float(np.mean(e)) if e else math.nan for name, e in errors.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="two or more profiled dataset folders, one CPU kind each")
    ap.add_argument("--cache-mib", default="1",
                    help="the sized rule's in-cache thresholds to compare, MiB moved, comma-separated (default 1)")
    args = ap.parse_args(argv)
    try:
        cache_mib = [float(v) for v in args.cache_mib.split(",")]
    except ValueError:
        cache_mib = []
    if not cache_mib or any(not (v > 0 and math.isfinite(v)) for v in cache_mib):
        raise UserError(f"--cache-mib {args.cache_mib}: allowed: positive numbers of MiB, comma-separated")
    if len(args.data) < 2:
        raise UserError(f"--data {' '.join(args.data)}: two folders or more (one CPU kind each) are compared")
    kinds = {}
    for folder in args.data:
        measured = dataset.measured_configs(folder)  # refuses an empty folder
        desc = descriptor.for_env(measured[0].env)
        if desc.kind != "cpu":
            raise UserError(f"--data {folder}: measured on {desc.name!r}, not a CPU kind (this compares CPU kinds)")
        kinds[folder] = desc
    pairs = [(a, b) for a, b in itertools.permutations(args.data, 2) if descriptor.probes_shared(kinds[a], kinds[b])]
    if not pairs:
        raise UserError(f"--data {' '.join(args.data)}: no two of these kinds measured the same step probes")
    kernels = {folder: measured_kernels(folder) for folder in {f for pair in pairs for f in pair}}
    names = None
    for a, b in pairs:
        speedups = rules(kinds[a], kinds[b], cache_mib)
        n, mape = pair_mape(kernels[a], kernels[b], speedups)
        if names is None:
            names = list(speedups)
            print(f"{'source -> target':<58}{'n':>5}" + "".join(f"{name:>16}" for name in names))
        print(f"{kinds[a].name + ' -> ' + kinds[b].name:<58}{n:>5}" + "".join(f"{mape[k]:>15.1f}%" for k in names))
    print("\n(MAPE of the profile-matched kernels' summed time per configuration: the source kind's measured kernels "
          "divided by each rule's speed-up, against the target's measured ones)")
    return 0


if __name__ == "__main__":
    run_script(main)
