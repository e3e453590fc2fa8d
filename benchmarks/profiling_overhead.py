"""Does profiling a record slow the timed steps of a harvest pass? Compare slices run back to back.

    for run in none1 all1 none2 all2; do
        taskset -c 1 gnn-ptp collect --grid training/grids/cpu.toml --out /tmp/ab/$run/<cpu kind> \\
            --threads 1 --profile ${run%?} --limit 90
    done
    python benchmarks/profiling_overhead.py --unprofiled /tmp/ab/none1/<kind> /tmp/ab/none2/<kind> \\
        --profiled /tmp/ab/all1/<kind> /tmp/ab/all2/<kind>

The harvest profiles one extra step after a record's timed steps (``harvest.measure_record``), so a
profiler that left anything behind would slow the next record's timing. Alternating the slices (none,
all, none, all) puts the machine's drift beside the effect: the ratio of two unprofiled slices is the
drift, profiled over unprofiled (geometric means of each pair of slices, per configuration) the effect.
Reads the records only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp.errors import UserError, run_script  # noqa: E402
from gnn_ptp.records import iter_records, record_problem  # noqa: E402


def step_medians(folder: str) -> dict[str, tuple[float, str, bool]]:
    """Per configuration key: (step median ms, precision class, profiled) of a folder's ok records."""
    return {r["key"]: (r["timing"]["step_ms"]["median"], r["config"]["precision"], bool(r.get("profile")))
            for r in iter_records(folder, check=record_problem)
            if r.get("status") == "ok" and (r.get("ddp") or {}).get("world_size", 1) == 1}


def describe(r: np.ndarray) -> str:
    d = np.abs(2 * (r - 1) / (r + 1))
    return (f"median {np.median(r):.3f} (p10 {np.percentile(r, 10):.3f}, p90 {np.percentile(r, 90):.3f}); "
            f"|a - b| / mean median {100 * np.median(d):.1f} %")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--unprofiled", nargs="+", required=True, help="folders of slices run with --profile none")
    ap.add_argument("--profiled", nargs="+", required=True, help="folders of the same slices with --profile all")
    args = ap.parse_args(argv)
    folders = {f"none{i + 1}": f for i, f in enumerate(args.unprofiled)}
    folders |= {f"all{i + 1}": f for i, f in enumerate(args.profiled)}
    runs = {n: step_medians(f) for n, f in folders.items()}
    keys = sorted(set.intersection(*(set(v) for v in runs.values())))
    if not keys:
        raise UserError(f"no configuration has an ok record in every slice ({', '.join(folders.values())})")
    print(f"{len(keys)} configurations in every slice; profiled records per profiled slice: "
          + ", ".join(f"{n} {sum(runs[n][k][2] for k in keys)}" for n in runs if n.startswith("all")))
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            print(f"{b} / {a}: {describe(np.array([runs[b][k][0] / runs[a][k][0] for k in keys]))}")

    def geo(prefix: str, k: str) -> float:
        values = [runs[n][k][0] for n in names if n.startswith(prefix)]
        return float(np.exp(np.mean(np.log(values))))

    both = np.array([geo("all", k) / geo("none", k) for k in keys])
    print(f"profiled / unprofiled (geometric means of the slices, per configuration): median {np.median(both):.3f}, "
          f"mean {np.mean(both):.3f}")
    for precision in sorted({runs[names[0]][k][1] for k in keys}):
        sel = np.array([runs[names[0]][k][1] == precision for k in keys])
        print(f"  {precision}: median {np.median(both[sel]):.3f} (n {int(sel.sum())})")
    return 0


if __name__ == "__main__":
    run_script(main)
