"""The size fold's refitted prior on the convolutions of profiled steps measured apart, by family and kind.

    python benchmarks/size_fold_convolutions.py --data datasets/cpu \\
        --apart datasets/cpu/cpu-size-fresh-profiles-2026-12-06 --apart datasets/cpu/cpu-size-sealed-profiles-2026-12-06

The prior is refitted to the size fold's smaller half as the protocol refits it (``protocol.prior_refit`` with the
data's shipped section's options, fastest labels, ``protocol.size_split`` of ``--seed``), then the matched
convolution kernels of each ``--apart`` folder's steps at least ``protocol.SIZE_FACTOR`` x the half's largest are
split by family, kind (depthwise-like: ``prior.depthwise_shapes``; grouped: ``prior.grouped_conv``; the rest dense),
dtype and direction: their measured time, the prior's sum over it, and the rate they reached. The folders need
per-op profiles (``collect --profile``). Seen sets: not a score (README *Protocol*, "Where the size folds' prior
still errs").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gnn_ptp import prior_fit, protocol  # noqa: E402
from gnn_ptp.errors import UserError, run_script  # noqa: E402

FAMILIES = ("regnet", "mobilenet", "efficientnet", "resnet", "densenet", "convnext", "random-cnn", "vgg")


def table(data: str, apart: list[str], seed: int) -> list[str]:
    from prior_error_sources import _fold_data

    samples, refit, name = _fold_data(data, "fastest")
    parts = protocol.size_split(samples, seed)
    top = parts.pop("train_max_flops")
    profile = refit.fit(name, parts["train"] + parts["val"])
    lines = []
    for folder in apart:
        theirs, theirs_refit, theirs_name = _fold_data(folder, "fastest")
        if theirs_name != name:
            raise UserError(f"--apart {folder}: its steps are of {theirs_name}, --data's of {name}")
        rows = prior_fit.kernel_rows(protocol.fresh_tests(theirs, top), theirs_refit.seconds[name])
        pred = prior_fit._prior_seconds(rows, profile).numpy()
        s, flops = rows.seconds.numpy(), rows.flops.numpy()
        cat, dt, fam = np.array(rows.category), np.array(rows.dtype), np.array(rows.family)
        bwd = rows.backward.numpy()
        grouped = rows.grouped.numpy().astype(bool)
        dw = ~np.isnan(rows.depthwise[:, 0].numpy())
        lines.append(f"== {folder}: size fold seed {seed}, the prior refitted to the half <= {top:.3g} FLOPs")
        for family in FAMILIES:
            for kind, of_kind in (("depthwise-like", dw), ("grouped", grouped & ~dw), ("dense", ~grouped & ~dw)):
                for dtype in ("fp32", "bf16"):
                    for backward in (False, True):
                        m = (fam == family) & (cat == "conv") & (dt == dtype) & (bwd == backward) & of_kind
                        if m.sum() < 3:
                            continue
                        lines.append(f"  {family:12s} {kind:15s} {dtype} {'bwd' if backward else 'fwd'} n{int(m.sum()):4d} "
                                     f"{s[m].sum() * 1e3:8.0f} ms  x{pred[m].sum() / s[m].sum():.2f}  "
                                     f"{flops[m].sum() / s[m].sum() / 1e9:6.1f} GFLOP/s")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="datasets/cpu", help="profiled CPU folder the size fold splits")
    ap.add_argument("--apart", action="append", default=[], metavar="DIR",
                    help="a profiled folder measured apart (repeatable)")
    ap.add_argument("--seed", type=int, default=2)
    args = ap.parse_args()
    if not args.apart:
        raise UserError("--apart: give at least one profiled folder measured apart "
                        "(datasets/cpu/cpu-size-fresh-profiles-2026-12-06)")
    for folder in args.apart:
        if not (Path(folder) / "profiles").is_dir():
            raise UserError(f"--apart {folder}: no profiles/ folder in it; give a folder measured with --profile "
                            "(datasets/cpu/cpu-size-*-profiles-*)")
    print("\n".join(table(args.data, args.apart, args.seed)))


if __name__ == "__main__":
    run_script(main)
