"""Analytic peak memory (gnn_ptp/memory.py) against real CPU training steps: the error table.

    PYTHONPATH=. python3 benchmarks/memory.py [--quick] [--json out.json]
    PYTHONPATH=. python3 benchmarks/memory.py --records datasets/h100     # measured labels, OOM records

For each configuration a real training step runs on this CPU as the collector runs it (after one
warm-up step that creates the optimizer state), under torch.profiler with profile_memory=True; the
measured peak is the bytes resident before the step (parameters, buffers, optimizer state, batch)
plus the peak of the profiler's memory events (``memory.measure_cpu_peak``). The prediction is the
liveness pass over the GPU-free trace for the CPU target. The issue's target: within 5 % for >= 90 %
of configurations, never below the floor (weights + gradients + optimizer state).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gnn_ptp import memory  # noqa: E402
from gnn_ptp.spec import Shape, parse_spec  # noqa: E402
from gnn_ptp.trace import StepConfig, trace_step  # noqa: E402

LLAMA = ["num_hidden_layers=2", "hidden_size=256", "intermediate_size=512", "num_attention_heads=4",
         "num_key_value_heads=2", "vocab_size=2000"]
MODELS = {
    # name: (spec, overrides, shape for a batch size)
    "llama-2l": ("hf:llama", LLAMA, lambda b: Shape(b, 128)),
    "llama-9l (replicated)": ("hf:llama", ["num_hidden_layers=9", *LLAMA[1:]], lambda b: Shape(b, 64)),
    "gpt2-2l": ("hf:gpt2", ["n_layer=2", "n_embd=128", "n_head=4", "vocab_size=2000"], lambda b: Shape(b, 128)),
    "bert-2l": ("hf:bert", ["num_hidden_layers=2", "hidden_size=128", "num_attention_heads=4",
                            "intermediate_size=256", "vocab_size=2000"], lambda b: Shape(b, 128)),
    "vit-2l": ("hf:vit", ["num_hidden_layers=2", "hidden_size=96", "num_attention_heads=3",
                          "intermediate_size=192", "patch_size=8"], lambda b: Shape(b, None, 32)),
    "resnet18": ("torchvision:resnet18", [], lambda b: Shape(b, None, 64)),
    "mobilenet_v3_small": ("torchvision:mobilenet_v3_small", [], lambda b: Shape(b, None, 64)),
    "random:mlp:0": ("random:mlp:0", [], lambda b: Shape(4 * b)),
    "random:cnn:1": ("random:cnn:1", [], lambda b: Shape(b, None, 32)),
    "random:transformer:2": ("random:transformer:2", [], lambda b: Shape(b, 64)),
}
PRECISIONS = ("fp32", "amp-bf16", "bf16")
BATCHES = (2, 8)
EXTRA = [("llama-2l", 2, "fp32", "sgd"), ("llama-2l", 2, "bf16", "adam"), ("resnet18", 8, "fp32", "sgd"),
         ("gpt2-2l", 8, "amp-bf16", "adam")]


def run(name: str, batch: int, precision: str, optimizer: str) -> dict:
    spec, overrides, shape = MODELS[name]
    config = StepConfig(parse_spec(spec, overrides), shape(batch), precision, optimizer, "cpu")
    start = time.perf_counter()
    est = memory.estimate(trace_step(config))
    predict_s = time.perf_counter() - start
    measured = memory.measure_cpu_peak(config)
    return {"model": name, "batch_size": batch, "precision": precision, "optimizer": optimizer,
            "measured_bytes": measured["peak_bytes"], "predicted_bytes": est.peak_bytes,
            "floor_bytes": est.floor_bytes, "peak_phase": est.peak_phase,
            "error": est.peak_bytes / measured["peak_bytes"] - 1, "predict_s": predict_s}


def judge_records(path: str, json_out: str | None) -> int:
    """The issue's targets on measured records: within 5 % of the label for >= 90 % of the ok ones,
    every out-of-memory one predicted not to fit."""
    rows = memory.check_records(path)
    ok = [r for r in rows if r["status"] == "ok"]
    oom = [r for r in rows if r["status"] == "oom"]
    print(f"{path}: {len(ok)} ok records with a peak-allocated label, {len(oom)} out-of-memory records")
    for r in ok:
        c = r["config"]
        print(f"  {c['spec']:<28}{c['batch_size']:>6} {c['precision']:<14}{r['measured_bytes'] / 1e9:>9.3f} GB"
              f"{r['predicted_bytes'] / 1e9:>9.3f} GB{100 * r['error']:>+8.2f}%")
    if ok:
        within = sum(abs(r["error"]) <= 0.05 for r in ok)
        print(f"within 5 %: {within} of {len(ok)} ({100 * within / len(ok):.0f} %; target >= 90 %)")
    missed = [r for r in oom if r["predicted_fits"]]
    for r in missed:
        print(f"  OOM predicted to fit: {r['config']} ({r['device_bytes'] / 1e9:.1f} GB)")
    if oom:
        print(f"out-of-memory records predicted not to fit: {len(oom) - len(missed)} of {len(oom)} (target: all)")
    if json_out:
        Path(json_out).write_text(json.dumps(rows, indent=2, default=str))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 2 only, no extra optimizers")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--records", help="instead: judge the records of a dataset (a folder or .jsonl) that "
                                          "carry a peak-allocated label or ran out of memory")
    args = parser.parse_args()
    if args.records:
        return judge_records(args.records, args.json)
    torch.set_num_threads(1)
    cases = [(m, b, p, "adamw") for m in MODELS for b in (BATCHES[:1] if args.quick else BATCHES)
             for p in PRECISIONS] + ([] if args.quick else EXTRA)
    print(f"torch {torch.__version__}, CPU; measured = resident before the step + torch.profiler peak")
    print(f"{'model':<22}{'batch':>6} {'precision':<10}{'optim':<7}{'measured':>11}{'predicted':>11}"
          f"{'error':>8}{'floor':>10}  phase")
    rows = []
    for case in cases:
        row = run(*case)
        rows.append(row)
        print(f"{row['model']:<22}{row['batch_size']:>6} {row['precision']:<10}{row['optimizer']:<7}"
              f"{row['measured_bytes'] / 1e6:>9.2f}MB{row['predicted_bytes'] / 1e6:>9.2f}MB"
              f"{100 * row['error']:>+7.2f}%{row['floor_bytes'] / 1e6:>8.2f}MB  {row['peak_phase']}", flush=True)
    errors = [abs(r["error"]) for r in rows]
    within = sum(e <= 0.05 for e in errors)
    print(f"\n{len(rows)} configurations: {within} within 5 % ({100 * within / len(rows):.0f} %; target >= 90 %), "
          f"median |error| {100 * statistics.median(errors):.2f} %, worst {100 * max(errors):.2f} %")
    below = [r for r in rows if r["predicted_bytes"] < r["floor_bytes"]]
    print(f"predicted below the floor (weights + gradients + optimizer state): {len(below)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
