"""Convolution microbenchmarks on this CPU, one thread (README *Protocol*, where the size error sits).

    taskset -c 1 python benchmarks/conv_probes.py OUT.json

The forward and the backward (input and weight gradients) of one dense convolution per shape (batch 8,
32-512 channels, 1x1 and 3x3, 7-56 pixels a side; 1e7-4e9 forward FLOPs), fp32 and bf16: the median of 15
calls after two warm-up calls, best of three such medians. Prints each shape's rates, writes the times.
"""
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp.depthwise_table import best_median  # noqa: E402
from gnn_ptp.descriptor import cpu_model  # noqa: E402

torch.set_num_threads(1)


def med(fn, n=15):
    """Best of three medians of ``n`` timed calls, after two warm-up calls."""
    return best_median(fn, n)


rows = []
for dt, prec in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
    for c in (32, 64, 128, 256, 512):
        for k in (1, 3):
            for h in (7, 14, 28, 56):
                flops = 2 * 8 * c * h * h * c * k * k
                if flops < 1e7 or flops > 4e9:
                    continue
                x = torch.randn(8, c, h, h, dtype=dt)
                w = torch.randn(c, c, k, k, dtype=dt)
                y = F.conv2d(x, w, padding=k // 2)
                g = torch.randn_like(y)
                fwd = med(lambda: F.conv2d(x, w, padding=k // 2))
                bwd = med(lambda: torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [k // 2] * 2, [1, 1],
                                                                      False, [0, 0], 1, [True, True, False]))
                rows.append({"precision": prec, "c": c, "k": k, "image_size": h, "batch_size": 8,
                             "forward_s": fwd, "backward_s": bwd, "forward_flops": flops})
                print(prec, c, k, h, f"fwd {flops/fwd/1e9:.0f} GFLOP/s bwd {2*flops/bwd/1e9:.0f}", flush=True)
env = {"cpu_kind": cpu_model(), "torch": torch.__version__, "threads": 1, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
       "python": platform.python_version()}
json.dump({"env": env, "rows": rows}, open(sys.argv[1], "w"), indent=1)
