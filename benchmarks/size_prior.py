"""The size protocol's prior row alone, on the fold's own test steps and on folders measured apart: a
development check of a prior form on seen sets, in minutes rather than the protocol's GNN training.

    python benchmarks/size_prior.py --data datasets/cpu --labels fastest \
        --apart datasets/cpu/cpu-size-third-2026-12-07 --apart datasets/cpu/cpu-size-fourth-2026-12-07 [--conv-blocks] [--attention-law] [--matmul-cap] [--slow-conv-law fp32]

The prior is refitted to the size fold's smaller half (``protocol.size_split``, ``protocol.prior_refit`` with the
data's shipped section's options, as ``evaluate --protocol size`` refits it; the split does not depend on the seed,
only its validation part does, and the prior is fitted to both), then every test step and every step of an
``--apart`` folder with at least ``protocol.SIZE_FACTOR`` x the half's largest FLOPs is priced (a configuration
in ``--data`` or in an earlier ``--apart`` folder is left out, as ``protocol.load_fresh`` leaves it out of
``--fresh-data``). Prints the step MAPE per set and each family's
median predicted / measured per set. Not a score: a form is scored by declared runs on a set measured after it
was declared (README *Protocol*).
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gnn_ptp import dataset, protocol  # noqa: E402
from gnn_ptp.errors import UserError, run_script  # noqa: E402


def price_sets(data: str, apart: list[str], labels: str, seed: int = 2, **refit_kw) -> dict[str, list[tuple]]:
    """Per set name ("test", then each ``apart`` folder's name) the (family, predicted ms, measured ms) of its
    steps priced by the size fold's refitted prior (``refit_kw``: ``protocol.prior_refit``'s options)."""
    quiet = lambda _: None  # noqa: E731
    refit = protocol.prior_refit([data], quiet, as_shipped=True, **refit_kw)  # before any graph is traced
    if refit is None:
        raise UserError(f"--data {data}: no per-op profiles, no prior to refit; give a folder measured with "
                        "--profile (datasets/cpu, datasets/cpu-<kind>)")
    _, samples, _ = protocol.load([data], True, quiet, label=labels)
    parts = protocol.size_split(samples, seed)
    top = parts.pop("train_max_flops")
    also, where = [], []
    for i, folder in enumerate(apart):  # as --fresh-data with the earlier folders as --seen-data
        fresh = protocol.load_fresh(folder, samples, True, quiet, False, labels, seen_dirs=apart[:i])
        tested = protocol.fresh_tests(fresh["samples"], top)
        also += tested
        where += [Path(folder).name] * len(tested)
    refit.apply({**parts, "also": also})
    out: dict[str, list[tuple]] = defaultdict(list)
    for s, name in [(s, "test") for s in parts["test"]] + list(zip(also, where)):
        out[name].append((s.family, float(s.prior_log_ms.double().exp().sum()), float(np.exp(float(s.y[0, 3])))))
    return dict(out)


def print_table(priced: dict[str, list[tuple]]) -> None:
    names = list(priced)
    for name in names:
        ape = [abs(p / t - 1) * 100 for _, p, t in priced[name]]
        print(f"{name:40s} n {len(ape):3d}  prior MAPE {np.mean(ape):6.2f} %")
    print("\nmedian predicted / measured per family and set")
    for family in sorted({f for rows in priced.values() for f, _, _ in rows}):
        cells = [f"{name[:14]} {np.median([p / t for f, p, t in priced[name] if f == family]):.2f}"
                 for name in names if any(f == family for f, _, _ in priced[name])]
        print(f"  {family:20s} " + ", ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="datasets/cpu", help="profiled CPU folder the size fold splits")
    ap.add_argument("--apart", action="append", default=[], metavar="DIR",
                    help="a folder measured apart whose larger steps are priced too (repeatable)")
    ap.add_argument("--labels", default="fastest", choices=dataset.LABEL_STATS)
    ap.add_argument("--seed", type=int, default=2, help="the size fold's seed (its validation part only)")
    ap.add_argument("--conv-blocks", action="store_true",
                    help="the dense convolutions' law with its channel-block costs (evaluate --conv-blocks)")
    ap.add_argument("--attention-law", action="store_true",
                    help="fused attention priced by its kernel's loops (evaluate --attention-law), on top of the "
                         "section's options")
    ap.add_argument("--slow-conv-law", default="", metavar="DTYPES",
                    help="comma-separated dtypes whose dense convolutions the additive shape law prices too "
                         f"(evaluate --slow-conv-law; allowed: {', '.join(protocol.SLOW_CONV_DTYPES)}), on top of the "
                         "section's options")
    ap.add_argument("--matmul-cap", action="store_true",
                    help="each matmul curve held at the fastest fraction it reaches on the fitted kernels "
                         "(evaluate --matmul-cap), on top of the section's options")
    args = ap.parse_args()
    law = tuple(d for d in args.slow_conv_law.split(",") if d)
    bad = [d for d in law if d not in protocol.SLOW_CONV_DTYPES]
    if bad:
        raise UserError(f"--slow-conv-law {args.slow_conv_law}: allowed: {', '.join(protocol.SLOW_CONV_DTYPES)}")
    for folder in args.apart:  # before the minutes --data's graphs and fit take
        if not Path(folder).is_dir():
            raise UserError(f"--apart {folder}: no such folder; give a folder of records measured apart "
                            "(datasets/cpu/cpu-size-*)")
    print_table(price_sets(args.data, args.apart, args.labels, args.seed, conv_blocks=args.conv_blocks,
                           attention_law=args.attention_law, matmul_cap=args.matmul_cap, slow_conv_law=law))


if __name__ == "__main__":
    run_script(main)
