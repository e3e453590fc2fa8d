"""Depthwise convolutions measured apart on a CPU kind, and the table that prices a step's from them.

A depthwise convolution whose input is channels-last (``ops.CHANNELS_LAST``: ConvNeXt's blocks leave theirs
so) runs another kernel than a contiguous one, with a cliff no power law in its shape follows: on one thread
of the first CPU kind the weight gradient of a 7x7 one over 640 channels takes about 1 ms and over 768
channels 17-25 ms, whatever the batch and image (README *Protocol*, "Channels-last depthwise
convolutions"). A law fitted to steps learns such a kernel from the families that have it (ConvNeXt alone
here), so a family left out takes it from none. Measured on the kind itself over a grid of generic shapes
(``measure``; ``python -m gnn_ptp.descriptor --depthwise-probes``), the kernel's time is a property of the
hardware, like its GEMM rates: stored in its descriptor (``Descriptor.depthwise_probe_s``), carried by its
``Hardware``, and read by a prior whose section says so (``prior.Profile.depthwise_probes``) through
``Table``: multilinear interpolation of log seconds over log batch, channels, pixels and taps between the
grid's points, clamped at its edges.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

AXES = ("batch_size", "channels", "pixels", "taps")
GRID = {"batch_size": (2, 8), "channels": (64, 96, 128, 192, 256, 384, 512, 640, 768, 1024),
        "image_size": (1, 2, 4, 8, 16), "kernel": (3, 5, 7)}
"""The shapes ``measure`` times: widths on the usual ladder, the taps of 3x3, 5x5 and 7x7 kernels, images of
small training steps (1-16 pixels a side), stride 1, same padding: 300 shapes per dtype and layout."""
GPU_GRID = {"batch_size": (8, 32, 128, 256), "channels": (64, 96, 192, 384, 768, 1024),
            "image_size": (7, 14, 28, 56), "kernel": (3, 7)}
"""``measure``'s grid on a GPU (``device="cuda"``): the batches and stage sizes of image models trained on
one (ConvNeXt's stages at 224 px are 56, 28, 14 and 7 pixels a side, its widths 96-768, its kernels 7x7):
192 shapes per dtype and layout. On the H200, ConvNeXt's channels-last 7x7 depthwise weight gradients in
fp32 took 0.14-90 ms in its steps and grew faster than the batch (32 -> 256 at 96 channels over 56 x 56:
4.5 -> 90 ms), where the fitted curves priced them at 3-44 % of that (README *Analytic H100 mode*)."""
GPU_DTYPES = ("fp32", "tf32", "bf16", "fp16")
"""The dtypes a GPU's probes time: "fp32" with cuDNN's TF32 off (the strict fp32 class), "tf32" the same
fp32 tensors with it on (the tf32 class and torch's default: cuDNN may pick another depthwise kernel)."""
LAYOUTS = ("contiguous", "channels_last")
PRICED_LAYOUTS = ("channels_last",)
"""The input layouts whose depthwise convolutions a table prices (``prior.Profile.depthwise_probes``). A
contiguous one measured apart runs 2-5x faster than in a step on the first CPU kind (its weights reordered
once for many calls), where the fitted law prices it within 5-40 %: it keeps the law."""


def wall_s(fn) -> float:
    """Seconds of one call of ``fn`` by the wall clock (a CPU kernel runs on the calling thread)."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def cuda_s(fn) -> float:
    """Seconds of one call of ``fn`` on the GPU, by CUDA events around it on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def best_median(fn, n: int = 9, call_s=wall_s, slow_s: float | None = None) -> float:
    """Best of three medians of ``n`` calls timed by ``call_s``, after two warm-up calls; with ``slow_s``,
    a call slower than that (one more timed call says; a channels-last fp32 depthwise weight gradient on a
    GPU can take 100 ms) is timed over one round of three."""
    fn()
    fn()
    rounds = 3
    if slow_s is not None and call_s(fn) > slow_s:
        n, rounds = 3, 1
    best = math.inf
    for _ in range(rounds):
        best = min(best, statistics.median(call_s(fn) for _ in range(n)))
    return best


def cuda_best_median(fn, n: int = 9) -> float:
    """``best_median`` of a GPU call (``cuda_s``), one round of three for a call over 20 ms."""
    return best_median(fn, n, call_s=cuda_s, slow_s=0.02)


def measure(layouts=PRICED_LAYOUTS, dtypes=("fp32", "bf16"), grid: dict = GRID, threads: int = 1,
            log=None, max_elements: int | None = None, device: str = "cpu") -> list[dict]:
    """Seconds of the forward and the fused backward (input and weight gradients) of one depthwise 2-d
    convolution per shape of ``grid``, dtype and input layout, on ``threads`` threads of the CPU or on
    ``device`` "cuda" (timed by CUDA events; "fp32" with cuDNN's TF32 off, "tf32" on: ``GPU_DTYPES``; the
    setting put back after), inputs of more than ``max_elements`` left out. A channels-last input is made
    as ConvNeXt's blocks make it (a permuted [N, H, W, C] tensor)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _measure(layouts, dtypes, grid, log, max_elements, torch.device(device))
    finally:
        torch.set_num_threads(before)


def _measure(layouts, dtypes, grid: dict, log, max_elements: int | None, device: torch.device) -> list[dict]:
    kinds = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    timer = cuda_best_median if device.type == "cuda" else best_median
    rows = []
    tf32 = torch.backends.cudnn.allow_tf32
    try:
        for dtype in dtypes:
            torch.backends.cudnn.allow_tf32 = dtype == "tf32"
            rows += _measure_dtype(dtype, kinds[dtype], layouts, grid, log, max_elements, device, timer)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    return rows


def _measure_dtype(dtype: str, dt: torch.dtype, layouts, grid: dict, log, max_elements: int | None,
                   device: torch.device, timer) -> list[dict]:
    import torch.nn.functional as F

    rows = []
    shapes = [(b, c, h, k) for b in grid["batch_size"] for c in grid["channels"] for h in grid["image_size"]
              for k in grid["kernel"] if max_elements is None or b * c * h * h <= max_elements]
    for b, c, h, k in shapes:
        for layout in layouts:
            x = (torch.randn(b, h, h, c, dtype=dt, device=device).permute(0, 3, 1, 2) if layout == "channels_last"
                 else torch.randn(b, c, h, h, dtype=dt, device=device))
            w = torch.randn(c, 1, k, k, dtype=dt, device=device)
            g = torch.randn_like(F.conv2d(x, w, padding=k // 2, groups=c))
            fwd = timer(lambda: F.conv2d(x, w, padding=k // 2, groups=c))
            bwd = timer(lambda: torch.ops.aten.convolution_backward(
                g, x, w, None, [1, 1], [k // 2] * 2, [1, 1], False, [0, 0], c, [True, True, False]))
            rows.append({"precision": dtype, "layout": layout, "batch_size": b, "channels": c,
                         "image_size": h, "taps": k * k, "forward_s": fwd, "backward_s": bwd})
            if log:
                log(f"depthwise {dtype} {layout} b{b} c{c} {h}px {k}x{k}: forward "
                    f"{fwd * 1e3:.3f} ms, backward {bwd * 1e3:.3f} ms")
    return rows


GPU_PROBE_DIR = Path(__file__).with_name("gpu_probes")
"""Where a GPU's probes are kept (``<hardware>.json``, as ``python -m gnn_ptp.depthwise_table`` writes them
on a GPU loan): a GPU has no measured descriptor to hold them."""


@lru_cache(maxsize=None)
def gpu_probe_rows(hardware: str, folder: str | None = None) -> tuple:
    """The depthwise probes measured on a GPU (``GPU_PROBE_DIR/<hardware>.json``), one tuple object per
    file (``table_of`` caches by it); () where none were measured."""
    path = Path(folder or GPU_PROBE_DIR) / f"{hardware}.json"
    if not hardware or not path.is_file():
        return ()
    return tuple(json.loads(path.read_text())["rows"])


def provenance(threads: int = 1) -> str:
    """Where a descriptor's probes come from: this CPU, torch version, threads and the date."""
    from datetime import datetime, timezone

    from gnn_ptp.descriptor import cpu_model

    return (f"depthwise_table.measure on {cpu_model()}, {threads} thread(s), torch {torch.__version__}, "
            f"{datetime.now(timezone.utc).strftime('%Y-%m-%d')}")


class Table:
    """Log seconds on a full grid of (batch, channels, pixels, taps) per (dtype, direction, layout), from
    ``measure``'s rows."""

    def __init__(self, rows):
        self.grids: dict[tuple[str, str, str], tuple[list[np.ndarray], np.ndarray]] = {}
        keys = {(r["precision"], d, r.get("layout", "contiguous")) for r in rows for d in ("forward", "backward")}
        for key in sorted(keys):
            dtype, direction, layout = key
            chosen = [r for r in rows if r["precision"] == dtype and r.get("layout", "contiguous") == layout]
            points = [(r["batch_size"], r["channels"], r["image_size"] ** 2, r["taps"], r[f"{direction}_s"])
                      for r in chosen]
            axes = [np.array(sorted({p[i] for p in points}), dtype=float) for i in range(len(AXES))]
            table = np.full([len(a) for a in axes], np.nan)
            for p in points:
                table[tuple(int(np.searchsorted(ax, v)) for ax, v in zip(axes, p[:4]))] = math.log(p[4])
            if np.isnan(table).any():
                raise ValueError(f"depthwise probes: the grid of {key} is not full")
            self.grids[key] = ([np.log(a) for a in axes], table)

    def seconds(self, dtype: str, backward: bool, layout: str, shapes: torch.Tensor) -> torch.Tensor:
        """Seconds of each kernel of ``shapes`` ([N, 4]: batch, channels, pixels, taps, as
        ``prior.depthwise_shapes`` gives them), float64 [N]; NaN without a grid for them."""
        grid = self.grids.get((dtype, "backward" if backward else "forward", layout))
        out = torch.full((shapes.shape[0],), float("nan"), dtype=torch.float64)
        if grid is None or shapes.shape[0] == 0:
            return out
        axes, table = grid
        logs = np.log(np.maximum(shapes.double().numpy(), 1.0))
        lo, hi, w = [], [], []
        for d, ax in enumerate(axes):  # the grid cell each kernel falls in, per axis, and its place in it
            v = np.clip(logs[:, d], ax[0], ax[-1])
            i = np.clip(np.searchsorted(ax, v, side="right") - 1, 0, max(len(ax) - 2, 0))
            j = np.minimum(i + 1, len(ax) - 1)
            span = ax[j] - ax[i]
            lo.append(i)
            hi.append(j)
            w.append(np.divide(v - ax[i], span, out=np.zeros_like(v), where=span > 0))
        total = np.zeros(len(logs))
        for corner in range(2 ** len(axes)):
            up = [(corner >> d) & 1 for d in range(len(axes))]
            weight = np.prod([w[d] if u else 1.0 - w[d] for d, u in enumerate(up)], axis=0)
            total += weight * table[tuple(hi[d] if u else lo[d] for d, u in enumerate(up))]
        return torch.from_numpy(np.exp(total))

    def priced(self, shapes: torch.Tensor, backward: torch.Tensor, dtypes: list[str], which: torch.Tensor,
               layout: str) -> torch.Tensor:
        """Per kernel (float64 [N]) its seconds for the depthwise-like convolutions of ``which`` (bool [N];
        ``shapes``: ``prior.depthwise_shapes``, NaN rows for other kernels) run with an input of ``layout``,
        by dtype and direction; NaN for every other kernel or where the table has no grid for them."""
        out = torch.full((shapes.shape[0],), float("nan"), dtype=torch.float64)
        has = which & ~torch.isnan(shapes[:, 0])
        if not bool(has.any()):
            return out
        names = np.array(dtypes)
        for d in sorted(set(names[has.numpy()].tolist())):
            for b in (False, True):
                m = has & torch.from_numpy(names == d) & (backward == b)
                if bool(m.any()):
                    out[m] = self.seconds(d, b, layout, shapes[m])
        return out


_TABLES: dict[int, tuple[tuple, Table]] = {}
"""Tables built from a ``Hardware``'s rows, by the rows' identity (the rows kept alive beside them)."""


def table_of(rows: tuple) -> Table | None:
    """The ``Table`` of a ``Hardware.depthwise_probe_s`` (built once per rows object); None where empty."""
    if not rows:
        return None
    hit = _TABLES.get(id(rows))
    if hit is None or hit[0] is not rows:
        hit = (rows, Table(rows))
        _TABLES[id(rows)] = hit
    return hit[1]


def priced(shapes: torch.Tensor, backward: torch.Tensor, dtypes: list[str], channels_last: torch.Tensor | None,
           rows: tuple) -> torch.Tensor:
    """Per kernel (float64 [N]) the seconds the table of ``rows`` (``Hardware.depthwise_probe_s``) gives a
    depthwise-like convolution with a channels-last input (``channels_last``, bool [N]; the layout a table
    prices, ``PRICED_LAYOUTS``), NaN for every other kernel or where the table has no grid for it."""
    table = table_of(rows)
    if table is None or channels_last is None:
        return torch.full((shapes.shape[0],), float("nan"), dtype=torch.float64)
    return table.priced(shapes, backward, dtypes, channels_last, PRICED_LAYOUTS[0])


def probe_file(rows: list[dict], env: dict, threads: int, date: str) -> dict:
    """What ``python -m gnn_ptp.depthwise_table`` writes: the rows and where they were measured (the
    hardware, driver, CUDA and torch versions, threads and the date: ``records.environment``)."""
    return {"schema": 1, "kind": "depthwise_probes", "hardware": env.get("hardware"),
            "device_name": env.get("device_name"), "driver": env.get("driver"), "cuda": env.get("cuda"),
            "cudnn": env.get("cudnn"), "torch": env.get("torch"), "cpu_model": env.get("cpu_model"),
            "threads": threads, "date": date, "rows": rows}


def main(argv=None) -> None:
    """Measure the depthwise probes of this machine's CPU or GPU into a JSON file (a GPU has no descriptor
    to hold them: its file is kept as ``GPU_PROBE_DIR/<gpu>.json``, read by ``gpu_probe_rows``)."""
    import argparse
    import sys
    from datetime import datetime, timezone

    from gnn_ptp.errors import UserError
    from gnn_ptp.records import environment
    from gnn_ptp.store import atomic_write_text

    ap = argparse.ArgumentParser(prog="python -m gnn_ptp.depthwise_table", description=main.__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", required=True, type=Path, help="the JSON file to write (never overwritten)")
    ap.add_argument("--layouts", default="both", choices=("both", *LAYOUTS))
    ap.add_argument("--dtypes", default=None,
                    help=f"comma-separated, of {', '.join(GPU_DTYPES)} (default: "
                         f"{','.join(GPU_DTYPES)} on a GPU, fp32,bf16 on a CPU)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (--device cpu)")
    ap.add_argument("--small", action="store_true", help="one shape per axis end (a check that it runs)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop after the (layout, dtype) grid during which this many seconds have passed "
                         "(channels-last ones first: the ones priced); the file is written after every whole "
                         "grid, so a process killed mid-grid keeps the grids before it")
    args = ap.parse_args(argv)
    dtypes = tuple(d for d in (args.dtypes or ",".join(GPU_DTYPES if args.device == "cuda" else ("fp32", "bf16")))
                   .split(",") if d)
    bad = [d for d in dtypes if d not in GPU_DTYPES or (d == "tf32" and args.device == "cpu")]
    if bad or not dtypes:
        raise UserError(f"--dtypes {args.dtypes}: a comma-separated list of {', '.join(GPU_DTYPES)} "
                        "(tf32 on a GPU only)")
    if args.out.exists():
        raise UserError(f"--out {args.out}: exists; probes are never overwritten, give a new file")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device here (give --device cpu to probe this CPU)")
    if args.budget_s is not None and args.budget_s <= 0:
        raise UserError(f"--budget-s {args.budget_s}: a positive number of seconds")
    grid = GPU_GRID if args.device == "cuda" else GRID
    if args.small:
        grid = {k: (v[0], v[-1]) for k, v in grid.items()}
    layouts = sorted(LAYOUTS if args.layouts == "both" else (args.layouts,), key=lambda la: la not in PRICED_LAYOUTS)
    start = time.perf_counter()
    env = environment(torch.device(args.device))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows, left = [], []
    for layout in layouts:
        for dtype in dtypes:
            if args.budget_s is not None and rows and time.perf_counter() - start > args.budget_s:
                left.append(f"{layout} {dtype}")
                continue
            rows += measure((layout,), (dtype,), grid, threads=args.threads, device=args.device,
                            log=lambda m: print(m, file=sys.stderr, flush=True))
            date = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # written after every whole grid
            atomic_write_text(json.dumps(probe_file(rows, env, args.threads, date), indent=1) + "\n", args.out)
    if left:
        print(f"--budget-s {args.budget_s:g} spent: not measured {', '.join(left)}", file=sys.stderr)
    print(f"{len(rows)} depthwise probes on {env.get('device_name')} in {time.perf_counter() - start:.0f} s -> {args.out}")


if __name__ == "__main__":
    from gnn_ptp.errors import run_script

    run_script(main)
