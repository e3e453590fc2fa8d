"""The physical prior's step and per-phase error on one dataset under several calibrations.

    git show 83b8844:gnn_ptp/prior_calibration.json > /tmp/before.json
    python benchmarks/compare_calibrations.py --data datasets/h200-blind /tmp/before.json gnn_ptp/prior_calibration.json

Each file is a ``prior_calibration.json``; the section the dataset's hardware uses (``prior.CURVES_OF``: the
H200 uses ``h100``) prices every configuration of ``--data`` through the same launch-queue step model
(``prior.phase_ms``). Prints per file: step MAPE, per-phase MAPE (forward, backward, optimizer), and step
MAPE per family and per precision class. No fitting: what changed between calibrations, on steps measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import prior, prior_fit  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a dataset folder with per-op profiles")
    ap.add_argument("calibrations", nargs="+", type=Path, help="prior_calibration.json files to compare")
    args = ap.parse_args()
    tables = {}
    for path in args.calibrations:
        try:
            tables[path] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            ap.error(f"calibration {path}: not a readable prior_calibration.json ({e.__class__.__name__})")
    hw, samples, _ = prior_fit.load_profiled(args.data)
    section = prior.section_for(hw.name, tables[args.calibrations[0]])
    for path, table in tables.items():
        if section not in table:
            ap.error(f"calibration {path}: no section {section!r} (sections: {', '.join(sorted(table))})")
    true = np.array([s.y[0].double().exp().numpy()[:4] for s in samples])
    family = np.array([s.family for s in samples])
    precision = np.array([s.precision for s in samples])
    print(f"{args.data}: {len(samples)} configurations on {hw.description}; section {section}\n")
    print(f"{'calibration':<36}{'step':>7}{'fwd':>7}{'bwd':>7}{'opt':>7}   per family | per precision class")
    for path, table in tables.items():
        profile = prior.profile_from_dict(hw, table[section])
        pred = np.array([prior.phase_ms(s, profile) for s in samples])
        ape = np.abs(pred / true - 1) * 100
        fams = " ".join(f"{f} {ape[family == f, 3].mean():.1f}" for f in sorted(set(family)))
        classes = " ".join(f"{c} {ape[precision == c, 3].mean():.1f}" for c in sorted(set(precision)))
        print(f"{str(path)[-36:]:<36}{ape[:, 3].mean():6.1f}%{ape[:, 0].mean():6.1f}%{ape[:, 1].mean():6.1f}%"
              f"{ape[:, 2].mean():6.1f}%   {fams} | {classes}")


if __name__ == "__main__":
    main()
