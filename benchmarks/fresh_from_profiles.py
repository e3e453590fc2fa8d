"""A CPU kind's fresh-allocation cost fitted to its own per-op profiles, against the microbenchmark.

    python benchmarks/fresh_from_profiles.py --data datasets/cpu-amd-epyc-family-26-model-2 datasets/cpu

glibc maps every allocation above its mmap threshold fresh from the kernel, so a kernel whose output is
that large pays page faults on top of its work (README *Sharded data parallelism*, fresh buffers).
``descriptor.measure_fresh_alloc`` measures the cost per MiB on the machine itself; a kind whose machine
can no longer be measured still has its profiles, in which the kernels that allocate above the threshold
ran with their faults. Here the cost per byte is fitted with the kind's curves (``prior_fit.fit_device``
with ``fresh={"threshold_bytes": T, "s_per_byte": None}``, the options of its shipped prior section), to
the profiled kernels of every family, and printed beside the measured figures where the kind has them:
its descriptor's one-process cost and its gloo profile's 2- and 4-rank ones.

Declared and scored in README *Sharded data parallelism* (eighteenth session): on the two kinds whose cost
is measured the fit gave 1.02x (second AMD) and 2.17x (Intel) the measurement, so no kind takes a fitted
figure (on the Intel kind the largest element-wise kernels' curve misfit is folded into it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp.errors import UserError, run_script  # noqa: E402

THRESHOLD_BYTES = 33_423_360
"""glibc's mmap threshold as bisected on both measured CPU kinds (``fsdp_overheads.measure_fresh``): just
under its 32 MiB ceiling (``DEFAULT_MMAP_THRESHOLD_MAX``), to which the dynamic threshold rises."""

MIB = 2 ** 20


def fit_kind(data: Path, steps: int = 1500) -> dict:
    """The fitted cost of ``data``'s kind and what it was fitted to; the measured figures beside it."""
    import torch

    from benchmarks.calibrate_prior import _first_env
    from gnn_ptp import descriptor, prior, prior_fit

    t0 = time.time()
    env = _first_env(data)
    desc = descriptor.for_env(env)
    kw = {**prior_fit.section_options(prior.calibration().get(desc.curves_section(), {})), "depthwise": True}
    hw, samples, seconds = prior_fit.load_profiled(data, profiler_cost=kw.pop("profiler_cost"))
    if hw.kind != "cpu":
        raise UserError(f"--data {data}: a {hw.kind}'s dataset; a fresh-allocation cost is a CPU's")
    rows = prior_fit.kernel_rows(samples, seconds)
    faulted = prior.fresh_seconds(rows.fresh, THRESHOLD_BYTES, 1.0)
    families = Counter(f for f, b in zip(rows.family, (faulted > 0).tolist()) if b) if faulted is not None else {}
    fitted = prior_fit.fit_device(rows, hw, steps=steps, fresh={"threshold_bytes": THRESHOLD_BYTES, "s_per_byte": None},
                                  **kw)
    fresh = fitted.get("fresh")
    measured = desc.fresh()
    gloo = _gloo_figures(desc.name)
    return {"kind": desc.name, "data": str(data), "kernels": len(rows), "faulted_kernels": dict(families),
            "faulted_MiB": float(faulted.sum()) / MIB if faulted is not None else 0.0,
            "options": kw, "fitted_ms_per_MiB": fresh["s_per_byte"] * MIB * 1e3 if fresh else None,
            "measured_ms_per_MiB": measured["s_per_byte"] * MIB * 1e3 if measured else None,
            "measured_source": desc.fresh_alloc.get("source") if measured else None,
            "gloo_ms_per_MiB": gloo, "wall_s": round(time.time() - t0, 1),
            "torch": torch.__version__}


def _gloo_figures(kind: str) -> dict:
    """The kind's shipped gloo profile's FSDP fresh-buffer cost per rank count (ms per MiB), if any."""
    from gnn_ptp import interconnect

    profile = interconnect.builtin().get("cpu-gloo" if kind == "amd-epyc" else f"cpu-gloo-{kind}")
    fsdp = profile.fsdp if profile is not None else {}
    return {r: v["fresh"]["ms_per_MiB"] for r, v in sorted(fsdp.items()) if (v.get("fresh") or {}).get("ms_per_MiB")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="+", type=Path, required=True, help="CPU dataset folders with per-op profiles")
    ap.add_argument("--steps", type=int, default=1500, help="optimizer steps of the fit (prior_fit.fit_device)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    for d in args.data:
        if not d.is_dir():
            ap.error(f"--data {d}: not a folder")
    results = []
    print(f"{'kind':<48} {'faulted kernels':>16} {'fitted':>8} {'measured':>9} {'ratio':>6} {'gloo 2 / 4 ranks':>18}")
    for d in args.data:
        r = fit_kind(d, args.steps)
        results.append(r)
        fit, meas = r["fitted_ms_per_MiB"], r["measured_ms_per_MiB"]
        ratio = f"{fit / meas:.2f}" if fit and meas else "-"
        gloo = " / ".join(f"{v:.3f}" for v in r["gloo_ms_per_MiB"].values()) or "-"
        print(f"{r['kind']:<48} {sum(r['faulted_kernels'].values()):>16} "
              f"{(f'{fit:.3f}' if fit else '-'):>8} {(f'{meas:.3f}' if meas else '-'):>9} {ratio:>6} {gloo:>18}")
        print(f"  families {r['faulted_kernels']}, {r['faulted_MiB']:.0f} MiB faulted, options {r['options']}, "
              f"{r['wall_s']} s")
    print("ms per MiB above the threshold; fitted: with the curves to the kind's profiles; measured: "
          "its descriptor's one-process figure (descriptor.measure_fresh_alloc or its gloo 2-rank one)")
    if args.json:
        from gnn_ptp.store import atomic_write_text

        atomic_write_text(json.dumps(results, indent=1) + "\n", args.json)


if __name__ == "__main__":
    run_script(main)
