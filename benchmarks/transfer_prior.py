"""The physical prior moved from one CPU kind to another, scored on the other kind's measured steps.

    python benchmarks/transfer_prior.py --data datasets/cpu datasets/cpu-amd-epyc-family-26-model-2 \\
        datasets/cpu-intel-r-xeon-r-processor-family-6-model-167

For every ordered pair of the folders (one CPU kind each), the source kind's shipped calibration section
(its curves and host costs, fitted to its own profiled steps by ``calibrate_prior.py --profiles``) is moved
to the target kind by their measured descriptors (``descriptor.transfer``) and prices every configuration
measured on the target: step MAPE, the median predicted / measured step, MAPE per precision class. Each
transfer mode of ``--modes`` (``descriptor.TRANSFER_MODES``: ``ceilings`` scales every peak by the ceilings'
ratio; ``split`` moves only a kernel's time at the ceilings by them and the rest by the non-GEMM ratio) gets
its own columns.

No record of the target kind enters the prior: a section fitted on the source's steps alone, moved by two
measured descriptors. This is the cross-hardware protocol's "prior moved by the ceilings" without its
per-fold refit (the protocol fits the same curves in each fold to the training kind's steps; here the
shipped section, fitted to all of them) and without the GNN, in a minute instead of an hour.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import dataset, descriptor, prior  # noqa: E402
from gnn_ptp.errors import UserError, run_script  # noqa: E402


def kind_of(folder: str):
    """(the folder's measured configurations, the CPU kind's descriptor); refuses a folder of another kind
    before any graph is loaded (``samples_of``)."""
    measured = dataset.measured_configs(folder)  # refuses an empty folder
    desc = descriptor.for_env(measured[0].env)
    if desc.kind != "cpu":
        raise UserError(f"--data {folder}: measured on {desc.name!r}, not a CPU kind (this compares CPU kinds)")
    return measured, desc


def samples_of(folder: str, measured) -> list:
    """A folder's samples (its graphs traced or read from the caches)."""
    return dataset.make_samples(measured, dataset.load_graphs(folder, measured, True))


def score(samples, profile) -> dict:
    """Step MAPE, median predicted / measured and MAPE per precision class of ``profile`` on ``samples``."""
    pred = np.array([prior.phase_ms(s, profile)[3] for s in samples])
    true = np.array([float(np.exp(s.y.numpy()[0, :3]).sum()) for s in samples])
    ape = np.abs(pred - true) / true * 100
    precisions = np.array([s.precision for s in samples])
    return {"mape": float(ape.mean()), "median_ratio": float(np.median(pred / true)),
            "by_precision": {p: float(ape[precisions == p].mean()) for p in sorted(set(precisions))}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="two or more dataset folders, one CPU kind each")
    ap.add_argument("--modes", default=",".join(descriptor.TRANSFER_MODES),
                    help=f"transfer modes to compare, comma-separated (allowed: {', '.join(descriptor.TRANSFER_MODES)})")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in descriptor.TRANSFER_MODES]
    if bad or not modes:
        raise UserError(f"--modes {args.modes}: allowed: {', '.join(descriptor.TRANSFER_MODES)}")
    if len(args.data) < 2:
        raise UserError(f"--data {' '.join(args.data)}: needs two folders or more (one CPU kind each)")
    kinds = {folder: kind_of(folder) for folder in args.data}
    names = [desc.name for _, desc in kinds.values()]
    if len(set(names)) < len(names):
        raise UserError(f"--data {' '.join(args.data)}: two folders of the same CPU kind ({names})")
    kinds = {folder: (samples_of(folder, measured), desc) for folder, (measured, desc) in kinds.items()}
    sources = set()  # kinds whose section was fitted to their own steps: only a pair from one is a held-out score
    for folder, (_, desc) in kinds.items():
        fitted_on = desc.steps_fitted_on()
        if fitted_on == desc.name:
            sources.add(folder)
        print(f"{desc.name}: {folder}, section {desc.curves_section()!r}, steps fitted on {fitted_on or 'none'}"
              f"{'' if fitted_on == desc.name else '  (NOT its own steps: no pair from it is scored)'}")
    print()
    head = f"{'source -> target':<60}{'n':>5}" + "".join(f"{m + ' MAPE':>16}{'median':>8}" for m in modes)
    print(head)
    rows = []
    for src_folder, tgt_folder in itertools.permutations(args.data, 2):
        if src_folder not in sources:  # its prior is another kind's moved to it, and would move again
            continue
        src, (samples, tgt) = kinds[src_folder][1], kinds[tgt_folder]
        own = src.profile()
        results = {m: score(samples, descriptor.transfer(own, src, tgt, mode=m)) for m in modes}
        rows.append((src.name, tgt.name, results))
        line = f"{src.name + ' -> ' + tgt.name:<60}{len(samples):>5}"
        line += "".join(f"{r['mape']:>15.1f}%{r['median_ratio']:>8.2f}" for r in results.values())
        print(line)
    print(f"\n{'mean of the pairs':<65}" + "".join(
        f"{np.mean([r[2][m]['mape'] for r in rows]):>15.1f}%{'':>8}" for m in modes))
    print("\nMAPE per precision class (source -> target: mode: class MAPE ...)")
    for src_name, tgt_name, results in rows:
        for m, r in results.items():
            classes = "  ".join(f"{p} {v:.1f}" for p, v in r["by_precision"].items())
            print(f"  {src_name} -> {tgt_name}: {m}: {classes}")
    return 0


if __name__ == "__main__":
    run_script(main)
