"""How much of a large model's optimizer time is the session's page faults, on a CPU folder's records.

    python benchmarks/fresh_sessions.py --data datasets/cpu

Two tables, from what is already measured (no model is run):

1. **Per file and day (one collection session each), the optimizer phase per parameter** of every configuration
   with at least ``--min-params`` parameters: ns per parameter of the timed steps' median optimizer phase, by
   precision class, the range over the folder's records. AdamW on a CPU runs one parameter tensor at a time; over
   a 100 M-parameter layer its in-place kernels stream the state at the memory's bandwidth, and two of its kernels
   (``sqrt`` and the ``div`` by the bias correction) allocate an output the size of the layer, a fresh mapping
   whose pages fault in as it is written.
2. **Per profiled folder, those kernels over the configuration's largest tensors** (``--min-numel`` elements or
   more, the optimizer phase of each per-op profile): ms per call and ms per MiB of the tensor, split into the
   kernels that allocate their output and the in-place ones.

Where the in-place kernels hold and the allocating ones move from session to session, the step's spread is the
machine's state (what a fresh mapping costs on it that day), not anything a model's shape says; the collector
records that cost in every record since the fifty-third session (``host_probe.fresh_fill``).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp.errors import UserError, run_script  # noqa: E402

ALLOCATING = ("aten::sqrt", "aten::div")
"""AdamW's single-tensor kernels that allocate a layer-sized output (torch.optim.adamw ``_single_tensor_adamw``:
``(exp_avg_sq.sqrt() / bias_correction2_sqrt)``); the others (``lerp_``, ``mul_``, ``addcmul_``, ``addcdiv_``,
``add_``) write in place."""


def _value(v):
    return ast.literal_eval(v) if isinstance(v, str) else v


def _records(folder: Path) -> dict[Path, list[dict]]:
    """The ok records of every .jsonl under ``folder``, by file."""
    out = {}
    for path in sorted(folder.rglob("*.jsonl")):
        rows = []
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("status") == "ok" and r.get("params"):
                rows.append(r)
        if rows:
            out[path] = rows
    return out


def per_parameter(folder: Path, records: dict[Path, list[dict]], min_params: float) -> list[str]:
    lines = [f"optimizer phase per parameter, configurations with >= {min_params / 1e6:.0f} M parameters "
             "(ns per parameter: median of a file's records of one day, min-max; n records)"]
    for path, rows in records.items():
        by = defaultdict(list)
        for r in rows:
            if r["params"] < min_params:
                continue
            opt = (_value(r.get("timing")) or {}).get("optimizer_ms", {}).get("median")
            if opt is not None:  # a file's records of one day: one session
                by[(r["timestamp"][:10], r["family"], r["params"], r["config"]["precision"])].append(
                    opt * 1e6 / r["params"])
        for day in sorted({k[0] for k in by}):
            lines.append(f"  {path.relative_to(folder)}, {day}")
            for (_, family, params, prec), v in sorted(kv for kv in by.items() if kv[0][0] == day):
                lines.append(f"    {family:<12} {params / 1e6:6.1f} M  {prec:<9} {statistics.median(v):6.2f} "
                             f"({min(v):.2f}-{max(v):.2f}; n {len(v)})")
    return lines


def allocating_kernels(folder: Path, records: dict[Path, list[dict]], min_numel: float) -> list[str]:
    lines = [f"optimizer kernels over tensors of >= {min_numel / 1e6:.0f} M elements, per profiled step: "
             "allocating (sqrt, div) against in-place, ms per call and ms per MiB of the tensor"]
    by_id = {r["id"]: r for rows in records.values() for r in rows if r.get("id")}
    for path in sorted(folder.rglob("profiles/*.jsonl.gz")):
        with gzip.open(path, "rt") as fh:
            for line in fh:
                d = json.loads(line)
                rec = by_id.get(d["id"])
                if rec is None:
                    continue
                names, sigs, ops = d["names"], _value(d["sigs"]), _value(d["ops"])
                cols = _value(d["columns"])
                at = {c: i for i, c in enumerate(cols)}
                got = {"allocating": [0, 0.0, 0.0], "in place": [0, 0.0, 0.0]}
                for o in ops:
                    if o[at["phase"]] != 2:  # the optimizer phase
                        continue
                    shapes = sigs[o[at["sig"]]][0]
                    first = shapes[0] if shapes and shapes[0] else []
                    numel = 1
                    for x in first:
                        numel *= x
                    if numel < min_numel:
                        continue
                    kind = "allocating" if names[o[at["name"]]] in ALLOCATING else "in place"
                    ms = o[at["self_cpu_us"]] / 1e3
                    itemsize = 2 if rec["config"]["precision"] == "bf16" else 4  # the parameters' dtype
                    got[kind][0] += 1
                    got[kind][1] += ms
                    got[kind][2] += numel * itemsize / 2 ** 20
                if not got["allocating"][0]:
                    continue
                cells = [f"{k} n {n} {ms / n:7.1f} ms a call, {ms / mib:.2f} ms/MiB" for k, (n, ms, mib) in got.items() if n]
                lines.append(f"  {path.parent.parent.name:<40} {rec['family']:<8} {rec['config']['precision']:<9} "
                             + "; ".join(cells) + f"  ({rec['timestamp'][:16]})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="datasets/cpu", help="a CPU dataset folder (every .jsonl and profile under it)")
    ap.add_argument("--min-params", type=float, default=3e7)
    ap.add_argument("--min-numel", type=float, default=5e7)
    args = ap.parse_args()
    folder = Path(args.data)
    if not folder.is_dir():
        raise UserError(f"--data {args.data}: not a folder; give a CPU dataset folder such as datasets/cpu")
    if args.min_params <= 0 or args.min_numel <= 0:
        raise UserError(f"--min-params {args.min_params:g} / --min-numel {args.min_numel:g}: both must be > 0")
    records = _records(folder)  # read once, for both tables
    if not records:
        raise UserError(f"--data {args.data}: no ok records in any .jsonl under it; give a CPU dataset folder such as "
                        "datasets/cpu")
    print("\n".join(per_parameter(folder, records, args.min_params)))
    print()
    print("\n".join(allocating_kernels(folder, records, args.min_numel)))


if __name__ == "__main__":
    run_script(main)
