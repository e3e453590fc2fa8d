"""Depthwise convolution microbenchmarks on this CPU, one thread (README *Protocol*, "Channels-last depthwise
convolutions").

    taskset -c 1 python benchmarks/depthwise_probes.py OUT.json [--quick]
    taskset -c 1 python benchmarks/depthwise_probes.py OUT.json --layout both --grid small

The forward and the fused backward (input and weight gradients) of one depthwise 2-d convolution (groups =
channels, stride 1, same padding) per shape, fp32 and bf16, 3x3, 5x5 and 7x7 kernels (the taps MobileNet,
EfficientNet and ConvNeXt use), timed by ``gnn_ptp.depthwise_table.measure`` (best of three medians of 9
calls). ``--grid large`` (the default): batch 8 and 32, 32-384 channels, 7-56 pixels a side, inputs no larger
than MobileNet's widest early layer. ``--grid small``: the grid a descriptor's probes use (``python -m
gnn_ptp.descriptor --depthwise-probes``): batch 2 and 8, 64-1,024 channels, 1-16 pixels a side. ``--layout``:
the input contiguous (NCHW, as most torchvision models run them) or channels-last strided (as ConvNeXt's
blocks leave it: ``ops.CHANNELS_LAST``), or both. Writes the rows with the CPU, torch version and date.
"""
import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import depthwise_table  # noqa: E402
from gnn_ptp.descriptor import cpu_model  # noqa: E402

LARGE = {"batch_size": (8, 32), "channels": (32, 96, 384), "image_size": (7, 14, 28, 56), "kernel": (3, 5, 7)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="the smaller batch only")
    ap.add_argument("--grid", choices=("large", "small"), default="large",
                    help="large: batch 8-32, 32-384 channels, 7-56 pixels a side; small: the descriptor's grid")
    ap.add_argument("--layout", choices=("contiguous", "channels_last", "both"), default="contiguous",
                    help="the input's memory layout (default contiguous, NCHW)")
    args = ap.parse_args(argv)
    grid = dict(depthwise_table.GRID if args.grid == "small" else LARGE)
    if args.quick:
        grid["batch_size"] = grid["batch_size"][:1]
    layouts = depthwise_table.LAYOUTS if args.layout == "both" else (args.layout,)
    rows = depthwise_table.measure(layouts, grid=grid, log=print,
                                   max_elements=8 * 384 * 56 * 56 if args.grid == "large" else None)
    env = {"cpu_kind": cpu_model(), "torch": torch.__version__, "threads": 1, "python": platform.python_version(),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
