"""Validate the all-reduce head on real data-parallel runs: the gloo DDP records of datasets/cpu/.

    python benchmarks/ddp_gloo.py [--data datasets/cpu] [--interconnect cpu-gloo]

For every measured DDP step (2 and 4 gloo processes on the 2-core machine), two predictions:
- head: the *measured* one-process step of the same configuration (median over its single-process
  records of the same UTC day as the DDP record: ``--twins``) as the compute, plus the all-reduce head
  (the cpu-gloo profile, the traced graph's gradient buckets, the measured backward time). This isolates
  the communication model from the GNN.
- end to end: `gnn_ptp.predict(..., gpus=N, hardware="cpu")`, the shipped CPU checkpoint's compute plus the
  same head: what a user gets.
Both against the measured DDP step (median over the timed steps of rank 0). Prints a table and MAPE per
world size; "naive" is the one-process step alone (no communication, no contention), for scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gnn_ptp.records import TWINS  # noqa: E402 (after the path insert)


def config_key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="datasets/cpu")
    ap.add_argument("--interconnect", default="cpu-gloo")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--twins", choices=TWINS, default="same-day",
                    help="which single-process records give a configuration's one-process step: those of the "
                         "same UTC day as its DDP record (default; all where none is), or all of them")
    args = ap.parse_args()

    from gnn_ptp import comm, interconnect
    from gnn_ptp.cli import _quiet_libraries
    from gnn_ptp.prediction import _graphs, predict_many
    from gnn_ptp.records import load_records, same_day_twins
    from gnn_ptp.spec import Shape, parse_spec
    from gnn_ptp.trace import StepConfig

    _quiet_libraries()
    data = Path(args.data)
    single = defaultdict(list)
    for path in sorted(data.glob("*.jsonl")):
        for r in load_records(path):
            if "ddp" not in r or not r["ddp"]:
                single[config_key(r["config"])].append(r)
    ddp = [r for path in sorted(data.glob("*.jsonl")) for r in load_records(path)
           if r.get("ddp") and r["ddp"].get("parallel", "ddp") == "ddp"]  # FSDP records: benchmarks/fsdp_gloo.py
    profile = interconnect.load(args.interconnect)

    rows = []
    fallbacks = 0
    for r in ddp:
        c, world = r["config"], r["ddp"]["world_size"]
        alone, fell_back = same_day_twins(single.get(config_key(c), []), [r], args.twins)
        if not alone:
            continue
        fallbacks += fell_back
        step_1 = statistics.median(x["timing"]["step_ms"]["median"] for x in alone)
        bwd_1 = statistics.median(x["timing"]["backward_ms"]["median"] for x in alone)
        spec = parse_spec(c["spec"], [f"{k}={v}" for k, v in (c.get("set") or {}).items()], c.get("task"))
        shape = Shape(c["batch_size"], c.get("seq_len"), c.get("image_size"))
        config = StepConfig(spec, shape, c["precision"], c.get("optimizer", "adamw"), "cpu")
        tensors, _ = _graphs([config])[0]
        slowdown = profile.compute_slowdown(world)
        fabric = profile.level(world)
        head = comm.ddp_step_comm(tensors["phase"].tolist(), tensors["grad_bytes"].tolist(), fabric, world,
                                  backward_ms=bwd_1 * slowdown,
                                  bucket_cap_bytes=r["ddp"].get("bucket_cap_mb", 25.0) * 1024 * 1024,
                                  overlap=profile.overlap)
        e2e = predict_many(c["spec"], [c["precision"]], c["batch_size"], seq_len=c.get("seq_len"),
                           image_size=c.get("image_size"), gpus=world, hardware="cpu",
                           optimizer=c.get("optimizer", "adamw"), overrides=[f"{k}={v}" for k, v in
                                                                             (c.get("set") or {}).items()],
                           task=c.get("task"), interconnect=args.interconnect)[0]
        head.exposed_ms += profile.bucket_copy_ms(float(tensors["grad_bytes"].sum()), world)
        measured = r["timing"]["step_ms"]["median"]
        rows.append({"spec": c["spec"], "precision": c["precision"], "batch_size": c["batch_size"],
                     "world_size": world, "params": r["params"], "measured_ms": measured,
                     "one_process_ms": step_1, "head_ms": step_1 * slowdown + head.exposed_ms,
                     "comm_ms": head.exposed_ms, "buckets": head.buckets, "e2e_ms": e2e.iteration_ms})

    def ape(pred, meas):
        return abs(pred / meas - 1) * 100

    print(f"{len(rows)} gloo DDP records with a one-process twin; interconnect {profile.name}")
    twins = ("the records of the same UTC day as each DDP record" if args.twins == "same-day"
             else "every single-process record")
    print(f"one-process twins: {twins}"
          + (f" ({fallbacks} records with none that day: all their twins)" if fallbacks else ""))
    print(f"{'model':<34}{'prec':>9}{'N':>3}{'params':>9}{'measured':>10}{'1-proc':>9}{'comm':>8}"
          f"{'head':>9}{'err':>7}{'e2e':>9}{'err':>7}")
    for x in rows:
        print(f"{x['spec'][:33]:<34}{x['precision']:>9}{x['world_size']:>3}{x['params'] / 1e6:>8.2f}M"
              f"{x['measured_ms']:>9.1f}ms{x['one_process_ms']:>7.1f}ms{x['comm_ms']:>6.1f}ms"
              f"{x['head_ms']:>7.1f}ms{ape(x['head_ms'], x['measured_ms']):>6.1f}%"
              f"{x['e2e_ms']:>7.1f}ms{ape(x['e2e_ms'], x['measured_ms']):>6.1f}%")
    print()
    print(f"{'world size':<12}{'n':>4}{'naive MAPE':>12}{'head MAPE':>11}{'head median':>13}{'e2e MAPE':>10}")
    for world in sorted({x["world_size"] for x in rows}) + [None]:
        sel = [x for x in rows if world is None or x["world_size"] == world]
        naive = [ape(x["one_process_ms"], x["measured_ms"]) for x in sel]
        head = [ape(x["head_ms"], x["measured_ms"]) for x in sel]
        e2e = [ape(x["e2e_ms"], x["measured_ms"]) for x in sel]
        print(f"{'all' if world is None else world:<12}{len(sel):>4}{statistics.mean(naive):>11.1f}%"
              f"{statistics.mean(head):>10.1f}%{statistics.median(head):>12.1f}%{statistics.mean(e2e):>9.1f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
