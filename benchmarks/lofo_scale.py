"""The correction's factor chosen across families, re-scored from stored LOFO runs (no training).

    python benchmarks/lofo_scale.py benchmarks/results/protocol-lofo-cpu-scaled-correction.json ...

For each protocol JSON with ``gnn-prior`` fold predictions (every LOFO run since the residual form), per seed:
the mean of families' step MAPE at each factor on the learnt correction (``train.CORRECTION_SCALES``), the
factor the protocol chooses over all families, and the row ``gnn-prior-lofo-scaled`` would have had (each
family priced with the factor chosen on the other families' folds, ``protocol.scale_across_folds``) beside
the rows the run stored. Runs from before the row existed are scored from their 4-digit stored predictions,
so figures agree with a fresh run's to about 0.01 point.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import metrics  # noqa: E402
from gnn_ptp.protocol import HALF, SCALED, scale_across_folds  # noqa: E402

ROWS = ("gnn-prior", HALF, SCALED, "prior")


def rescore(run: dict) -> list[dict]:
    """One row per seed: the stored rows' means, the factor across families' mean, worst family and
    factors."""
    by_seed = defaultdict(dict)
    for fold in run["folds"]:
        pred = fold["pred_ms"]
        if "gnn-prior" not in pred:
            continue
        by_seed[fold["seed"]][fold["test"]] = (np.array(fold["true_ms"]), np.array(pred["prior"]),
                                               np.array(pred["gnn-prior"]), fold)
    out = []
    for seed, folds in sorted(by_seed.items()):
        chosen, by_factor = scale_across_folds({f: v[:3] for f, v in folds.items()})
        per_family = {}
        for family, (true, prior, residual, _) in folds.items():
            s = chosen[family]
            per_family[family] = float(metrics.ape(prior * (residual / prior) ** s, true).mean())
        stored = {r: float(np.mean([metrics.ape(np.array(v[3]["pred_ms"][r]), v[0]).mean()
                                    for v in folds.values()]))
                  for r in ROWS if all(r in v[3]["pred_ms"] for v in folds.values())}
        worst = max(per_family, key=per_family.get)
        out.append({"seed": seed, "stored": stored, "across": float(np.mean(list(per_family.values()))),
                    "worst": (worst, per_family[worst]), "factors": Counter(chosen.values()),
                    "whole": min(by_factor, key=lambda s: (by_factor[s], s)), "by_factor": by_factor})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="protocol LOFO JSON files (evaluate --protocol lofo --json)")
    args = ap.parse_args(argv)
    scored = []
    for path in args.runs:
        try:
            run = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"{path}: not a readable protocol JSON ({e})", file=sys.stderr)
            return 2
        if run.get("protocol") != "lofo":
            print(f"{path}: a {run.get('protocol')!r} run; only lofo runs have families to choose across",
                  file=sys.stderr)
            return 2
        rows = rescore(run)
        if not rows:
            print(f"{path}: no gnn-prior fold predictions (run it with --variants gnn-prior)", file=sys.stderr)
            return 2
        scored += [(path, row) for row in rows]
    print(f"{'run':<70}{'seed':>5}  " + "".join(f"{r:>18}" for r in ROWS)
          + f"{'across families':>17}  worst family        factors (folds)       kind's factor")
    for path, row in scored:
        factors = ", ".join(f"{k:g} x{n}" for k, n in sorted(row["factors"].items()))
        print(f"{Path(path).name:<70}{row['seed']:>5}  "
              + "".join(f"{row['stored'][r]:>17.2f}%" if r in row["stored"] else f"{'-':>18}" for r in ROWS)
              + f"{row['across']:>16.2f}%  {row['worst'][0]:<12}{row['worst'][1]:5.1f}%  {factors:<22}"
              + f"{row['whole']:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
