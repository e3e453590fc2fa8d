"""What a CPU's square root costs on zeros, and how much optimizer time the zeros of AdamW's state take.

    python benchmarks/zero_sqrt.py                       # the running CPU, one thread
    python benchmarks/zero_sqrt.py --data datasets/cpu   # also: per family, the optimizer's sqrt time above its rate
    python benchmarks/zero_sqrt.py --records datasets/cpu/cpu-harvest-zero-counts-2026-11-28   # in-situ cost per zero
    python benchmarks/zero_sqrt.py --no-rates --batches     # are the zeros the collector's one reused batch?

First table: ns per element of ``torch.sqrt`` (and ``rsqrt``, the control) on 4 M elements of normal values
(uniform in [0.5, 1.5]), exact zeros and subnormals (1e-40), fp32, bf16 and fp64, each the median of 11
runs into a preallocated output, with and without ``torch.set_flush_denormal``. AdamW takes the square root
of ``exp_avg_sq`` every step, and an element stays zero for as long as its gradient has been zero
(``gnn_ptp/optimizer_state.py``).

With ``--data``: from each profiled record's optimizer phase, the self time of ``aten::sqrt`` per parameter,
against the 25th percentile of that rate over the folder's records of the same precision class (models of
at least 1 M parameters): the excess is the time the class's rate does not explain, per family its median
and largest share of the step. A sqrt whose output is a fresh allocation of hundreds of MB also pays page
faults (VGG's 129 M parameters), which this excess counts too: the second table is a screen, not a split.

With ``--records``: records that count their optimizer state's zeros (``optimizer_state``, since 2026-11-28).
Within each model and precision class (same parameters, other batch sizes and input sizes), every
configuration against the one with the fewest zero moments: the optimizer phase's growth over the growth in
zero ``exp_avg_sq`` elements, a slope through the origin per class (ns per zero moment) with its
correlation, then the zero share per family.

With ``--batches``: the collector times every step of a record on one batch, built once. Real training draws
a new batch each step, and an element of ``exp_avg_sq`` stays zero only while every batch so far gave it a
zero gradient. For each configuration of ``BATCH_CONFIGS`` (the CPU grid's configuration with the most zero
moments in each family that has many, fp32, AdamW as collected), the zero share after ``--steps`` steps on the
one batch, and after the same number and 4x as many steps with a new batch (the workload built again under
another seed) each step. One thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp.optimizer_state import zero_fraction  # noqa: E402
from gnn_ptp.profiles import read_profiles  # noqa: E402
from gnn_ptp.records import iter_records  # noqa: E402
from gnn_ptp.spec import ModelSpec, Shape, build  # noqa: E402

N = 4_000_000
VALUES = {"normal": lambda n, dt: torch.rand(n, dtype=torch.float32).add_(0.5).to(dt),
          "zeros": lambda n, dt: torch.zeros(n, dtype=dt),
          "subnormal": lambda n, dt: torch.full((n,), 1e-40 if dt == torch.float32 else 1e-310, dtype=dt)}


def ns_per_element(fn, x: torch.Tensor, runs: int = 11) -> float:
    out = torch.empty_like(x)
    fn(x, out=out)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(x, out=out)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / x.numel() * 1e9


def rates_table(n: int = N) -> None:
    torch.set_num_threads(1)
    print(f"ns per element, {n:,} elements, one thread, torch {torch.__version__}")
    print(f"{'dtype':<9}{'flush':<7}{'op':<7}" + "".join(f"{v:>11}" for v in VALUES) + "   zeros / normal")
    for dt in (torch.float32, torch.bfloat16, torch.float64):
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            for name, fn in (("sqrt", torch.sqrt), ("rsqrt", torch.rsqrt)):
                cells = {}
                for v, make in VALUES.items():
                    if v == "subnormal" and dt == torch.bfloat16:
                        cells[v] = float("nan")  # 1e-40 is a bf16 subnormal too, but rounds oddly: not timed
                        continue
                    cells[v] = ns_per_element(fn, make(n, dt))
                print(f"{str(dt).split('.')[1]:<9}{str(flush):<7}{name:<7}"
                      + "".join(f"{cells[v]:11.2f}" for v in VALUES) + f"   {cells['zeros'] / cells['normal']:6.1f}x")
    torch.set_flush_denormal(False)


def excess_table(data: Path) -> None:
    records = {r["id"]: r for r in iter_records(data)
               if r.get("status") == "ok" and not r.get("ddp") and r.get("id")}
    rows = []  # (family, precision, params, sqrt_s, step_s)
    for rid, p in read_profiles(data).items():
        r = records.get(rid)
        if r is None:
            continue
        names = p["names"]
        sqrt_s = sum(op[7] for op in p["ops"] if op[2] == 2 and names[op[0]] == "aten::sqrt") * 1e-6
        rows.append((r["family"], r["config"]["precision"], r["params"], sqrt_s,
                     r["timing"]["step_ms"]["median"] * 1e-3))
    if not rows:
        sys.exit(f"--data {data}: no profiled records (a folder with profiles/, e.g. datasets/cpu)")
    rate = {}
    for prec in sorted({r[1] for r in rows}):
        per = sorted(s / n for _, p, n, s, _ in rows if p == prec and n >= 1e6)
        rate[prec] = per[len(per) // 4] if per else 0.0
    print(f"\n{data}: {len(rows)} profiled records; optimizer sqrt rate (p25, ns per parameter): "
          + ", ".join(f"{p} {v * 1e9:.2f}" for p, v in rate.items()))
    by = defaultdict(list)
    for fam, prec, n, s, step in rows:
        by[fam].append(max(0.0, s - rate[prec] * n) / step)
    print(f"{'family':<20}{'n':>5}{'median excess':>15}{'largest':>10}{'records > 5 %':>15}")
    for fam, shares in sorted(by.items()):
        print(f"{fam:<20}{len(shares):>5}{statistics.median(shares) * 100:14.1f}%{max(shares) * 100:9.0f}%"
              f"{sum(s > 0.05 for s in shares):>15}")


def slope_table(folder: Path) -> None:
    groups = defaultdict(list)  # (spec, set, precision) -> (zeros, share, optimizer ms, family)
    for r in iter_records(folder):
        share = zero_fraction(r)
        if r.get("status") != "ok" or r.get("ddp") or share is None:
            continue
        c = r["config"]
        groups[(c["spec"], json.dumps(c.get("set"), sort_keys=True), c["precision"])].append(
            (r["optimizer_state"]["exp_avg_sq"]["zeros"], share, r["timing"]["optimizer_ms"]["median"], r["family"]))
    if not groups:
        sys.exit(f"--records {folder}: no record counts its optimizer state's zeros (collected before 2026-11-28?)")
    print(f"\n{folder}: {sum(map(len, groups.values()))} records with zero counts")
    print(f"{'class':<10}{'pairs':>6}{'ns per zero moment':>20}{'r':>7}")
    for prec in sorted({k[2] for k in groups}):
        dz, dt = [], []
        for key, rows in groups.items():
            if key[2] != prec:
                continue
            base = min(rows)
            for z, _, ms, _ in rows:
                if z > base[0]:
                    dz.append(z - base[0])
                    dt.append(ms - base[2])
        if len(dz) < 3:
            print(f"{prec:<10}{len(dz):>6}{'':>20}{'':>7}")
            continue
        slope_ns = sum(a * b for a, b in zip(dz, dt)) / sum(a * a for a in dz) * 1e6
        print(f"{prec:<10}{len(dz):>6}{slope_ns:20.2f}{statistics.correlation(dz, dt):7.2f}")
    shares = defaultdict(list)
    for rows in groups.values():
        for _, share, _, family in rows:
            shares[family].append(share)
    print("zero share of exp_avg_sq per family (median, largest): " + ", ".join(
        f"{f} {statistics.median(v):.0%} / {max(v):.0%}" for f, v in sorted(shares.items())))


BATCH_CONFIGS = [  # (spec, set, batch_size, seq_len, image_size): fp32 twins of each family's most-zero configuration
    ("torchvision:vgg11", {"num_classes": 10}, 4, None, 32),
    ("torchvision:resnet18", {}, 2, None, 32),
    ("random:cnn:0", {}, 8, None, 64),
    ("random:transformer:16", {"vocab_size": 4096}, 8, 32, None),
    ("hf:opt", {"ffn_dim": 512, "hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
                "vocab_size": 2000, "word_embed_proj_dim": 128}, 2, 64, None),
    ("hf:llama", {"hidden_size": 128, "intermediate_size": 344, "num_attention_heads": 4, "num_hidden_layers": 2,
                  "num_key_value_heads": 2, "vocab_size": 2000}, 2, 64, None),
    ("hf:gpt2", {"n_embd": 128, "n_head": 4, "n_layer": 2, "vocab_size": 2000}, 2, 64, None),
]


def _zero_share_after(spec: ModelSpec, shape: Shape, steps: int, fresh: bool) -> float:
    """exp_avg_sq's zero share after ``steps`` fp32 training steps as the collector runs them (its AdamW and
    ``training_step``), on one batch or a new batch each step (the workload built again under seed 1, 2, ...;
    its model is not used)."""
    from gnn_ptp.collect import _StepTimer, make_optimizer, training_step
    from gnn_ptp.optimizer_state import zero_counts
    from gnn_ptp.precision import get_precision

    cpu = torch.device("cpu")
    torch.manual_seed(0)
    workload = build(spec, shape, cpu)
    optimizer = make_optimizer("adamw", workload.model.parameters())
    step = training_step(workload.model, workload, optimizer, None, get_precision("fp32"), cpu)
    timer = _StepTimer(cpu)
    for i in range(steps):
        if fresh and i:
            torch.manual_seed(i)
            batch = build(spec, shape, cpu)
            workload.args, workload.kwargs, workload.targets = batch.args, batch.kwargs, batch.targets
        step(timer, [])
    cell = zero_counts(optimizer)["exp_avg_sq"]
    return cell["zeros"] / cell["elements"]


def batches_table(steps: int) -> None:
    torch.set_num_threads(1)
    print(f"\nzero share of exp_avg_sq, fp32, AdamW, one thread, torch {torch.__version__}")
    print(f"{'configuration':<44}{f'one batch, {steps}':>15}{f'new batches, {steps}':>20}{f'new, {4 * steps}':>12}")
    for name, overrides, b, seq, img in BATCH_CONFIGS:
        spec = ModelSpec.from_dict({"spec": name, "set": overrides})
        shape = Shape(b, seq, img)
        cells = [_zero_share_after(spec, shape, steps, False), _zero_share_after(spec, shape, steps, True),
                 _zero_share_after(spec, shape, 4 * steps, True)]
        label = f"{name} b{b} " + (f"seq {seq}" if seq else f"{img} px")
        print(f"{label:<44}{cells[0]:14.1%}{cells[1]:20.1%}{cells[2]:12.1%}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, help="a dataset folder with profiles/ to screen (e.g. datasets/cpu)")
    ap.add_argument("--records", type=Path, help="a folder of records that count their optimizer state's zeros")
    ap.add_argument("--batches", action="store_true",
                    help="zero shares after steps on one batch (as collected) and on a new batch each step")
    ap.add_argument("--steps", type=int, default=8, help="steps for --batches (the harvest's 3 warm-up + 5)")
    ap.add_argument("--elements", type=int, default=N)
    ap.add_argument("--no-rates", action="store_true", help="skip the microbenchmark (the tables of --data, --records only)")
    args = ap.parse_args()
    if not args.no_rates:
        rates_table(args.elements)
    if args.data:
        excess_table(args.data)
    if args.records:
        slope_table(args.records)
    if args.batches:
        batches_table(args.steps)


if __name__ == "__main__":
    main()
