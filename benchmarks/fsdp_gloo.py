"""Validate the FSDP schedule on real sharded runs: the gloo FSDP2 records of datasets/cpu/.

    python benchmarks/fsdp_gloo.py [--data datasets/cpu] [--interconnect cpu-gloo]

For every measured FSDP step (``collect --ddp --parallel fsdp|fsdp-no-reshard`` under torchrun, 2 and 4
gloo processes on the 2-core machine), the *measured* one-process step of the same configuration (its
forward, backward and optimizer medians, over its single-process records of the same UTC day as its
FSDP records: ``--twins``) is the compute, slowed by the profile's measured contention,
and gnn_ptp/fsdp.py adds the all-gathers and reduce-scatters of its blocks (the cpu-gloo profile's lines).
This isolates the FSDP model from the GNN. "naive" is the one-process step alone, for scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gnn_ptp.errors import run_script  # noqa: E402 (after the path insert)
from gnn_ptp.records import TWINS, same_day_twins  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="datasets/cpu")
    ap.add_argument("--interconnect", default="cpu-gloo")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--derived", action="store_true",
                    help="time all-gathers and reduce-scatters from the all-reduce lines (as before they were "
                         "measured), not from the profile's own measurements")
    ap.add_argument("--timing", choices=("all", "first", "last"), default="all",
                    help="which measurements of a configuration give its measured step: the median of all "
                         "(default), the first pass or the last")
    ap.add_argument("--twins", choices=TWINS, default="same-day",
                    help="which single-process records give a configuration's one-process step: those of the "
                         "same UTC day as its FSDP records (default; all where none is), or all of them")
    ap.add_argument("--day", metavar="YYYY-MM-DD",
                    help="score only the FSDP records of this UTC day (their twins are then that day's too): one "
                         "session's steps against the profile measured in it")
    ap.add_argument("--memory", action="store_true",
                    help="also compare the per-rank memory model with the records' memory labels (traces each "
                         "configuration on the CPU: slower)")
    ap.add_argument("--no-overheads", action="store_true",
                    help="leave out FSDP2's host overheads (calibrate-comm --fsdp's synthetic-stack figures)")
    ap.add_argument("--no-fresh", action="store_true",
                    help="leave out the fresh-buffer cost (page faults of FSDP2's flat buffers above the "
                         "allocator's mmap threshold), keeping the other overheads")
    args = ap.parse_args()
    if args.day:
        args.day = utc_day(args.day)

    from gnn_ptp import fsdp, interconnect
    from gnn_ptp.cli import _quiet_libraries
    from gnn_ptp.precision import get_precision
    from gnn_ptp.records import load_records
    from gnn_ptp.spec import ModelSpec, Shape, build

    _quiet_libraries()
    data = Path(args.data)
    single = defaultdict(list)
    measurements = defaultdict(list)  # one configuration (config, world size, mode): its measurements
    for path in sorted(data.glob("*.jsonl")):
        for r in load_records(path):
            if r.get("status") != "ok":
                continue
            if not r.get("ddp"):
                single[json.dumps(r["config"], sort_keys=True)].append(r)
            elif r["ddp"].get("parallel", "ddp") != "ddp" and (not args.day or r["timestamp"][:10] == args.day):
                measurements[(json.dumps(r["config"], sort_keys=True), r["ddp"]["world_size"],
                              r["ddp"]["parallel"])].append(r)
    profile = interconnect.load(args.interconnect)
    rows = []
    fallbacks = 0
    for group in measurements.values():
        group = sorted(group, key=lambda x: x["timestamp"])
        timed = group if args.timing == "all" else [group[0] if args.timing == "first" else group[-1]]
        r = group[0]
        c, world, mode = r["config"], r["ddp"]["world_size"], r["ddp"]["parallel"]
        alone, fell_back = same_day_twins(single.get(json.dumps(c, sort_keys=True), []), group, args.twins)
        if not alone:
            continue
        fallbacks += fell_back
        med = {k: statistics.median(x["timing"][k]["median"] for x in alone)
               for k in ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")}
        precision = get_precision(c["precision"])
        workload = build(ModelSpec.from_dict(c), Shape(c["batch_size"], c.get("seq_len"), c.get("image_size")),
                         "meta", precision.param_dtype)
        blocks = fsdp.find_blocks(workload.model)
        slowdown = profile.compute_slowdown(world)
        param_bytes = torch_bytes(precision.param_dtype)
        step = fsdp.fsdp_step(med["forward_ms"] * slowdown, med["backward_ms"] * slowdown,
                              med["optimizer_ms"] * slowdown, blocks, profile.level(world), world,
                              param_bytes=param_bytes, mode=mode, overlap=profile.overlap,
                              copy_ms=lambda b: profile.bucket_copy_ms(b, world),
                              collective=None if args.derived else
                              lambda kind, b: profile.collective_us(kind, b, world)[0],
                              overheads=None if args.no_overheads else overheads_of(profile, world, args.no_fresh))
        measured = statistics.median(x["timing"]["step_ms"]["median"] for x in timed)
        spread = (max(x["timing"]["step_ms"]["median"] for x in group) / min(
            x["timing"]["step_ms"]["median"] for x in group) - 1) * 100 if len(group) > 1 else None
        mem_pred = mem_meas = None
        if args.memory:
            from gnn_ptp.dataset import step_config_of
            from gnn_ptp.memory import estimate_config

            est = estimate_config(step_config_of(c, "cpu"))
            act, opt = fsdp.split_estimate(est.peak_by_phase, est.floor_bytes)
            mem_pred = fsdp.memory_per_rank(est.floor_bytes, act, blocks, world, param_bytes, mode, opt)
            labelled = [x["memory"]["peak_bytes"] for x in group
                        if x.get("memory", {}).get("kind") == "cpu_profiler_peak_allocated"]
            mem_meas = statistics.median(labelled) if labelled else None
        rows.append({"spec": c["spec"], "precision": c["precision"], "batch_size": c["batch_size"], "mode": mode,
                     "world_size": world, "blocks": len(blocks.block_params), "params": r["params"],
                     "measured_ms": measured, "one_process_ms": med["step_ms"], "head_ms": step.iteration_ms,
                     "comm_ms": step.comm_total_ms, "exposed_ms": step.exposed_ms,
                     "memory_predicted_bytes": mem_pred, "memory_measured_bytes": mem_meas,
                     "memory_kind": "cpu_profiler_peak_allocated", "measurements": len(group),
                     "repeat_spread_pct": spread})

    def ape(pred, meas):
        return abs(pred / meas - 1) * 100

    spreads = [x["repeat_spread_pct"] for x in rows if x["repeat_spread_pct"] is not None]
    print(f"{len(rows)} gloo FSDP configurations ({sum(x['measurements'] for x in rows)} records; the median of "
          f"each one's measurements) with a one-process twin; interconnect {profile.name}"
          + (f"; label noise: max/min - 1 between a configuration's measurements, median "
             f"{statistics.median(spreads):.1f}%" if spreads else ""))
    twins = ("the records of the same UTC day as each configuration's FSDP records" if args.twins == "same-day"
             else "every single-process record")
    if args.day:
        print(f"FSDP records of {args.day} (UTC) only")
    print(f"one-process twins: {twins}"
          + (f" ({fallbacks} configurations with none that day: all their records)" if fallbacks else ""))
    print(f"{'model':<32}{'prec':>9}{'mode':>17}{'N':>3}{'blk':>4}{'measured':>10}{'1-proc':>9}{'comm':>8}"
          f"{'head':>9}{'err':>7}")
    for x in rows:
        print(f"{x['spec'][:31]:<32}{x['precision']:>9}{x['mode']:>17}{x['world_size']:>3}{x['blocks']:>4}"
              f"{x['measured_ms']:>8.1f}ms{x['one_process_ms']:>7.1f}ms{x['comm_ms']:>6.1f}ms"
              f"{x['head_ms']:>7.1f}ms{ape(x['head_ms'], x['measured_ms']):>6.1f}%")
    if not rows:
        return
    print()
    print(f"{'world size':<12}{'n':>4}{'naive MAPE':>12}{'head MAPE':>11}{'head median':>13}")
    for world in sorted({x["world_size"] for x in rows}) + [None]:
        sel = [x for x in rows if world is None or x["world_size"] == world]
        naive = [ape(x["one_process_ms"], x["measured_ms"]) for x in sel]
        head = [ape(x["head_ms"], x["measured_ms"]) for x in sel]
        print(f"{'all' if world is None else world:<12}{len(sel):>4}{statistics.mean(naive):>11.1f}%"
              f"{statistics.mean(head):>10.1f}%{statistics.median(head):>12.1f}%")
    mem = [x for x in rows if x["memory_predicted_bytes"] and x["memory_measured_bytes"]]
    if mem:
        errs = sorted(ape(x["memory_predicted_bytes"], x["memory_measured_bytes"]) for x in mem)
        under = sum(x["memory_predicted_bytes"] < x["memory_measured_bytes"] for x in mem)
        print(f"\nper-rank peak memory, predicted vs the records' {mem[0]['memory_kind']} ({len(mem)} configurations): "
              f"median error {statistics.median(errs):.1f}%, mean {statistics.mean(errs):.1f}%, "
              f"{sum(e <= 10 for e in errs)} within 10%; predicted below measured in {under}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def utc_day(text: str) -> str:
    import datetime

    from gnn_ptp.errors import UserError

    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise UserError(f"--day {text}: not a date; allowed: YYYY-MM-DD (a UTC day), e.g. 2026-11-28") from None


def overheads_of(profile, world: int, no_fresh: bool):
    import dataclasses

    ov = profile.fsdp_overheads(world)
    return dataclasses.replace(ov, fresh_threshold_bytes=None) if ov is not None and no_fresh else ov


def torch_bytes(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


if __name__ == "__main__":
    run_script(main)
