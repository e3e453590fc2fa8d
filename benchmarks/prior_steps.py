"""How far the physical prior (gnn_ptp/prior.py) alone is from measured training steps of a dataset.

    python benchmarks/prior_steps.py --data datasets/cpu

The prior never sees a step time (its curves are fitted to kernel timings), so every configuration of
the dataset is held out from it. Prints MAPE / median / p90 of the step time per precision class and
per family, for the calibrated prior and for the plain peak roofline (same rates, ideal curves, no
launch floor), and the per-phase MAPE. This is the step-level evidence behind the analytic H100 mode's
expected error: the same composition (per-kernel times summed per phase) on hardware where steps were
measured. Graphs come from the dataset's cache (``gnn-ptp train``/``evaluate`` fill it) or are traced.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import dataset, metrics, prior  # noqa: E402
from gnn_ptp.hardware import get_hardware  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="datasets/cpu")
    args = ap.parse_args()
    measured = dataset.measured_configs(args.data)
    hw = get_hardware(measured[0].hardware)
    samples = dataset.make_samples(measured, dataset.load_graphs(args.data, measured, True))
    true = np.exp(np.stack([s.y.numpy()[0] for s in samples]))
    true = np.hstack([true, true.sum(1, keepdims=True)])
    predictors = {"prior (calibrated)": prior.get_profile(hw), "peak roofline": prior.Profile(hw)}
    preds = {name: np.stack([prior.phase_ms(s, p) for s in samples]) for name, p in predictors.items()}
    precisions, families = [s.precision for s in samples], [s.family for s in samples]
    print(f"{args.data}: {len(samples)} configurations on {hw.description}")
    print(f"calibration: {prior.get_profile(hw).source}\n")
    names = list(preds)
    print(f"{'step time':<22}" + "".join(f"{n:>22}" for n in names) + "   (MAPE / median APE)")
    reports = {n: metrics.report(p[:, 3], true[:, 3], precisions, families) for n, p in preds.items()}

    def cell(r):
        return f"{r['mape']:.1f}% / {r['median_ape']:.1f}%"

    print(f"{'all':<22}" + "".join(f"{cell(reports[n]['overall']):>22}" for n in names) + f"   n {len(samples)}")
    for group in ("per_precision", "per_family"):
        print()
        for key in reports[names[0]][group]:
            print(f"{key:<22}" + "".join(f"{cell(reports[n][group][key]):>22}" for n in names)
                  + f"   n {reports[names[0]][group][key]['n']}")
    p = preds[names[0]]
    ratio = np.median(p[:, 3] / true[:, 3])
    print(f"\n{names[0]}: per phase MAPE " + ", ".join(
        f"{ph} {metrics.summarize(metrics.ape(p[:, i], true[:, i]))['mape']:.1f}%"
        for i, ph in enumerate(("forward", "backward", "optimizer")))
          + f"; median predicted / measured step {ratio:.2f}")


if __name__ == "__main__":
    main()
