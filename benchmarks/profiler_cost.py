"""What the profiler adds to a CPU step: each profiled step's phases against its record's unprofiled medians.

    python benchmarks/profiler_cost.py --data datasets/cpu

The harvest profiles one extra step per record (``profiles.py``: ``torch.profiler`` with ``record_shapes``
and, on a CPU, ``profile_memory``) and stores the wall time of each phase between the step's marks
(``phase_ms``) beside the ops it recorded. The record's labels are the medians of its unprofiled steps. Per
family and phase this prints the median of profiled / unprofiled and of (profiled - unprofiled) per recorded
op, and the folder's per-op cost the CPU prior can take off its node seconds
(``node_labels.profiler_cost_us``, ``calibrate_prior.py --profiler-cost``). Reads the records and profiles
only.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import dataset, node_labels, profiles  # noqa: E402
from gnn_ptp.errors import UserError, run_script  # noqa: E402


def per_record(data: str) -> list[dict]:
    """Per profiled single-process record: family, configuration key, its unprofiled step median and, per
    phase, (profiled ms, unprofiled median ms, ops recorded)."""
    rows = []
    for r, p in node_labels.profiled_records(data):
        if p.get("device") == "cuda" or not p.get("phase_ms"):
            continue
        counts = profiles.phase_op_counts(p)
        row = {"family": r.get("family", "?"), "key": r.get("key"),
               "step_ms": ((r.get("timing") or {}).get("step_ms") or {}).get("median")}
        for i, name in enumerate(profiles.PHASES):
            profiled = p["phase_ms"].get(name)
            unprofiled = ((r.get("timing") or {}).get(f"{name}_ms") or {}).get("median")
            if profiled and unprofiled and counts[i]:
                row[name] = (profiled, unprofiled, counts[i])
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="datasets/cpu", help="a CPU dataset folder with per-op profiles")
    args = ap.parse_args()
    if not Path(args.data).is_dir():
        raise UserError(f"--data {args.data}: not a folder; give a dataset folder with profiles/ (datasets/cpu)")
    rows = per_record(args.data)
    if not rows:
        raise UserError(f"--data {args.data}: no CPU record with a profile that has phase times")
    groups = defaultdict(list)
    for r in rows:
        groups[r["family"]].append(r)
    print(f"{args.data}: {len(rows)} profiled records; per phase: median profiled / unprofiled, median "
          "(profiled - unprofiled) per recorded op, median ops recorded")
    print(f"{'family':<20}{'n':>5}  " + "  ".join(f"{p:>26}" for p in profiles.PHASES))
    for name in [*sorted(groups), "all"]:
        rs = rows if name == "all" else groups[name]
        cells = []
        for p in profiles.PHASES:
            a = np.array([r[p] for r in rs if p in r])
            cells.append(f"{np.median(a[:, 0] / a[:, 1]):6.2f}x {np.median((a[:, 0] - a[:, 1]) * 1e3 / a[:, 2]):7.2f} us "
                         f"[{np.median(a[:, 2]):6.0f}]" if len(a) else f"{'-':>26}")
        print(f"{name:<20}{len(rs):>5}  " + "  ".join(cells))
    labels = {stat: {m.key: m.ms.get("step_ms") for m in dataset.measured_configs(args.data, label=stat)}
              for stat in dataset.LABEL_STATS}
    ratios = {stat: [r["step_ms"] / v[r["key"]] for r in rows if r["step_ms"] and v.get(r["key"])]
              for stat, v in labels.items()}
    print("\nthe profiled record's unprofiled step median over its configuration's label (every record of the "
          "configuration): " + ", ".join(f"{stat} labels median {np.median(v):.3f}" for stat, v in ratios.items()
                                          if v))
    cost = node_labels.profiler_cost_us(args.data)
    print("\nthe folder's cost per recorded op (node_labels.profiler_cost_us: median of each record's, >= 0): "
          + ", ".join(f"{p} {c:.2f} us" for p, c in zip(profiles.PHASES, cost or ())))


if __name__ == "__main__":
    run_script(main)
