"""The harvest loop against the classic collector on the same CPU configurations, in one run.

    python benchmarks/harvest.py [--limit 90] [--rounds 2] [--json out.json]

Takes the first ``--limit`` configurations of training/grids/cpu.toml (interleaved: every family), and
measures them with ``collect --mode classic`` (one model per record, timed until build + warm-up are
under 20 % of the wall time, at least 10 steps and 1 s: today's collector) and ``collect --mode harvest``
(one model per shape, the classes swept over it, 3 warm-up steps, 5-20 timed steps in about 0.3 s,
profiles for a sample), each in a fresh process pinned to one core with one torch thread, alternating
``--rounds`` times so that a slow spell of the machine hits both. Prints, per loop: records per minute of
process time (imports included), the share of wall time in timed steps, within-record noise
((p90 - p10) / median of the step time), and how far the two loops' medians for the same configuration
are apart. Both loops write to scratch folders; nothing under datasets/ is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gnn_ptp import records  # noqa: E402
from gnn_ptp.stats import noise  # noqa: E402


def run_loop(loop: str, grid: Path, out: Path, limit: int, core: str) -> tuple[float, list[dict]]:
    mode, _, variant = loop.partition("-")
    cmd = [sys.executable, "-m", "gnn_ptp", "collect", "--grid", str(grid), "--out", str(out), "--device", "cpu",
           "--threads", "1", "--mode", mode, "--limit", str(limit)]
    if variant == "noprofile":
        cmd += ["--profile", "none"]
    if core and _has_taskset():
        cmd = ["taskset", "-c", core, *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    return seconds, list(records.iter_records(out))


def _has_taskset() -> bool:
    return subprocess.run(["which", "taskset"], capture_output=True).returncode == 0


def summarise(name: str, seconds: list[float], rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok"]
    noises = [n for n in (noise(r) for r in ok) if n is not None]
    timed = sum(r["collector"].get("timed_s", 0.0) for r in ok)
    return {"loop": name, "records": len(ok), "process_s": sum(seconds),
            "records_per_min": 60 * len(ok) / sum(seconds), "timed_share": timed / sum(seconds),
            "noise_median": statistics.median(noises), "noise_p90": sorted(noises)[int(0.9 * (len(noises) - 1))],
            "steps_median": statistics.median(r["timing"]["step_ms"]["n"] for r in ok)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", default=str(ROOT / "training" / "grids" / "cpu.toml"))
    p.add_argument("--limit", type=int, default=90, help="configurations per loop and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--core", default="1", help="taskset core ('' for none)")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--unprofiled", action="store_true",
                   help="also run the harvest without profiles (--profile none): what the profiles cost")
    args = p.parse_args()
    loops = ["classic", "harvest"] + (["harvest-noprofile"] if args.unprofiled else [])
    seconds = {loop: [] for loop in loops}
    rows = {loop: [] for loop in loops}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in loops if r % 2 == 0 else loops[::-1]:
                s, got = run_loop(mode, Path(args.grid), Path(tmp) / f"{mode}-{r}" / "cpu", args.limit, args.core)
                seconds[mode].append(s)
                rows[mode] += got
                print(f"round {r + 1} {mode}: {len(got)} records in {s:.1f} s", file=sys.stderr)
    summary = [summarise(m, seconds[m], rows[m]) for m in loops]
    medians = {m: {} for m in rows}
    for m in rows:
        for row in rows[m]:
            if row["status"] == "ok":
                medians[m].setdefault(row["key"], []).append(row["timing"]["step_ms"]["median"])
    both = set(medians["classic"]) & set(medians["harvest"])
    apart = [abs(statistics.median(medians["harvest"][k]) / statistics.median(medians["classic"][k]) - 1)
             for k in both]
    import torch

    from gnn_ptp.records import _cpu_model

    print(f"{_cpu_model()}, torch {torch.__version__}, one thread on core {args.core or 'any'}; "
          f"{args.limit} configurations of {Path(args.grid).name} x {args.rounds} rounds per loop")
    print(f"{'loop':<18}{'records':>8}{'process s':>11}{'records/min':>13}{'timed share':>13}"
          f"{'steps':>7}{'noise median':>14}{'noise p90':>11}")
    for s in summary:
        print(f"{s['loop']:<18}{s['records']:>8}{s['process_s']:>11.1f}{s['records_per_min']:>13.1f}"
              f"{s['timed_share']:>13.0%}{s['steps_median']:>7.0f}{s['noise_median']:>14.1%}{s['noise_p90']:>11.1%}")
    speedup = summary[1]["records_per_min"] / summary[0]["records_per_min"]
    for s in summary[2:]:
        print(f"{s['loop']} / classic records per minute: {s['records_per_min'] / summary[0]['records_per_min']:.1f}x")
    print(f"harvest / classic records per minute: {speedup:.1f}x (target >= 4x); noise ratio "
          f"{summary[1]['noise_median'] / summary[0]['noise_median']:.2f} (target <= 1); medians of the same "
          f"configuration apart: median {statistics.median(apart):.1%}, p90 "
          f"{sorted(apart)[int(0.9 * (len(apart) - 1))]:.1%} ({len(both)} configurations)")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "speedup": speedup, "apart": apart}, indent=2))


if __name__ == "__main__":
    main()
