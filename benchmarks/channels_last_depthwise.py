"""The convolutions of a dataset's profiled steps by input layout and kind, in-step time against the shipped
prior's price: where a channels-last depthwise convolution (``ops.CHANNELS_LAST``; ConvNeXt's) stands.

    python benchmarks/channels_last_depthwise.py --data datasets/h200

Per convolution class (depthwise-like or dense, ``prior.depthwise_shapes``; contiguous or channels-last
input), direction and dtype: the kernels matched in the profiles, their measured time summed and the
prior's sum over it (the kind's shipped section, as ``prior_error_sources.py`` prices); then every
channels-last depthwise shape (direction, dtype, batch, channels, pixels, taps) with its mean in-step time
and the prior's ratio. The shipped section has seen most families' kernels, so this is a decomposition,
not a held-out score. No probes needed: it says what a kind's probes (``python -m gnn_ptp.depthwise_table``
on a GPU, ``python -m gnn_ptp.descriptor --depthwise-probes`` on a CPU) would have to price.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gnn_ptp import ops, prior, prior_fit  # noqa: E402
from gnn_ptp.errors import run_script  # noqa: E402
from prior_error_sources import kind_profile  # noqa: E402

DIRECTIONS = "fbo"


def sums(samples: list, node_seconds: dict, profile: prior.Profile) -> tuple[dict, dict, dict]:
    """({(class, direction, dtype): [measured s, prior s, kernels]}, the same per channels-last depthwise
    shape, {family: configurations with a channels-last convolution})."""
    conv = ops.CATEGORIES.index("conv")
    by_class = defaultdict(lambda: [0.0, 0.0, 0])
    by_shape = defaultdict(lambda: [0.0, 0.0, 0])
    families = defaultdict(int)
    for s in samples:
        layout = getattr(s, "gemm_layout", None)
        if s.key not in node_seconds or layout is None:
            continue
        cl = prior.channels_last(layout)
        families[s.family] += int(bool(cl.any()))
        measured = prior_fit.measured_node_seconds(s, node_seconds[s.key])
        if measured is None:
            continue
        priced = prior.node_seconds(s.x, s.x_cat, profile, getattr(s, "fresh_bytes", None), layout)
        shapes = prior.depthwise_shapes(s.x, s.x_cat)
        depthwise = ~torch.isnan(shapes[:, 0])
        keep = ~torch.isnan(measured) & (measured > 0) & (s.x_cat[:, 1] == conv)
        for i in torch.nonzero(keep).reshape(-1).tolist():
            kind = ("channels-last " if cl[i] else "") + ("depthwise" if depthwise[i] else "dense")
            key = (kind, DIRECTIONS[int(s.phase[i])], ops.DTYPES[int(s.x_cat[i, 2])])
            cells = [by_class[key]]
            if cl[i] and depthwise[i]:
                cells.append(by_shape[key[1:] + tuple(int(v) for v in shapes[i].tolist())])
            for cell in cells:
                cell[0] += float(measured[i])
                cell[1] += float(priced[i])
                cell[2] += 1
    return dict(by_class), dict(by_shape), {f: n for f, n in families.items() if n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("datasets/h200"), help="a dataset folder with per-op profiles")
    args = ap.parse_args()
    hw, samples, node_seconds = prior_fit.load_profiled(args.data)
    profile = kind_profile(args.data, hw)
    by_class, by_shape, families = sums(samples, node_seconds, profile)
    print(f"{args.data}: {len(samples)} configurations on {hw.description}; with a channels-last convolution: "
          + (", ".join(f"{f} {n}" for f, n in sorted(families.items())) or "none"))
    print(f"calibration: {profile.source}\n")
    print(f"{'convolutions':<26}{'dir':>4}{'dtype':>7}{'kernels':>9}{'measured ms':>13}{'prior / measured':>18}")
    for (kind, direction, dtype), (m, p, n) in sorted(by_class.items()):
        print(f"{kind:<26}{direction:>4}{dtype:>7}{n:>9}{m * 1e3:>13.1f}{p / m:>18.2f}")
    print("\nchannels-last depthwise: direction, dtype, batch, channels, pixels, taps; mean in-step us, prior / measured")
    for key, (m, p, n) in sorted(by_shape.items()):
        print(f"  {key[0]} {key[1]:<5} b{key[2]:<4} c{key[3]:<5} {key[4]:>5} px {key[5]:>3} taps"
              f"{m / n * 1e6:>12.1f} us{p / m:>8.2f}")


if __name__ == "__main__":
    run_script(main)
