"""Depthwise convolution microbenchmarks on this CPU, one thread (README *Protocol*, the depthwise law).

    taskset -c 1 python benchmarks/depthwise_probes.py OUT.json [--quick]
    taskset -c 1 python benchmarks/depthwise_probes.py OUT.json --layout channels_last --grid small

The forward and the fused backward (input and weight gradients) of one depthwise 2-d convolution (groups =
channels, stride 1, same padding) per shape, fp32 and bf16, 3x3, 5x5 and 7x7 kernels (the taps MobileNet,
EfficientNet and ConvNeXt use); the median of 9 calls after two warm-up calls, best of three such medians.
``--grid large`` (the default): batch 8 and 32, 32-384 channels, 7-56 pixels a side. ``--grid small``: the
sizes small training steps hold, batch 2 and 8, 64-1024 channels on the usual width ladder, 1-16 pixels a
side. ``--layout``: the input contiguous (NCHW, as most torchvision models run them) or channels-last
strided (as ConvNeXt's blocks leave it: ``ops.CHANNELS_LAST``), or both. Prints each shape's time, writes
the rows with the CPU, torch version and date. What a step's depthwise convolution costs, measured apart from
any model, is what the prior's depthwise law (``prior.Profile.depthwise``: a power law in batch, channels,
pixels and taps) can be checked against: a law fitted to steps alone learns its shape from the families it
saw (README *The CPU prior*, "Channels-last depthwise convolutions").
"""
import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp.descriptor import cpu_model  # noqa: E402


def med(fn, n: int = 9) -> float:
    """Best of three medians of ``n`` timed calls, after two warm-up calls."""
    fn()
    fn()
    best = float("inf")
    for _ in range(3):
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        best = min(best, statistics.median(ts))
    return best


def shapes(quick: bool, grid: str = "large"):
    if grid == "small":
        for b in ((2,) if quick else (2, 8)):
            for c in (64, 96, 128, 192, 256, 384, 512, 640, 768, 1024):
                for h in (1, 2, 4, 8, 16):
                    for k in (3, 5, 7):
                        yield b, c, h, k
        return
    batches = (8,) if quick else (8, 32)
    for b in batches:
        for c in (32, 96, 384):
            for h in (7, 14, 28, 56):
                for k in (3, 5, 7):
                    if b * c * h * h > 8 * 384 * 56 * 56:  # no larger than MobileNet's widest early layer
                        continue
                    yield b, c, h, k


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--quick", action="store_true", help="the smaller batch only")
    ap.add_argument("--grid", choices=("large", "small"), default="large",
                    help="large: batch 8-32, 32-384 channels, 7-56 pixels a side; small: batch 2-8, 64-1024 "
                         "channels, 1-16 pixels a side (the sizes of small training steps)")
    ap.add_argument("--layout", choices=("contiguous", "channels_last", "both"), default="contiguous",
                    help="the input's memory layout (default contiguous, NCHW)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    layouts = ("contiguous", "channels_last") if args.layout == "both" else (args.layout,)
    rows = []
    for dt, prec in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for b, c, h, k in shapes(args.quick, args.grid):
            for layout in layouts:
                x = torch.randn(b, c, h, h, dtype=dt)
                if layout == "channels_last":
                    x = torch.randn(b, h, h, c, dtype=dt).permute(0, 3, 1, 2)  # as ConvNeXt's blocks leave it
                w = torch.randn(c, 1, k, k, dtype=dt)
                y = F.conv2d(x, w, padding=k // 2, groups=c)
                g = torch.randn_like(y)
                fwd = med(lambda: F.conv2d(x, w, padding=k // 2, groups=c))
                bwd = med(lambda: torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [k // 2] * 2, [1, 1],
                                                                      False, [0, 0], c, [True, True, False]))
                rows.append({"precision": prec, "layout": layout, "batch_size": b, "channels": c, "image_size": h,
                             "taps": k * k, "forward_s": fwd, "backward_s": bwd})
                print(f"{prec} {layout:13s} b{b:<3d} c{c:<4d} {h:2d}px {k}x{k}  fwd {fwd * 1e3:8.3f} ms  "
                      f"bwd {bwd * 1e3:8.3f} ms", flush=True)
    env = {"cpu_kind": cpu_model(), "torch": torch.__version__, "threads": 1, "python": platform.python_version(),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
