"""On a CUDA GPU: does the GPU-free trace record what the GPU really runs? Node-by-node agreement.

    PYTHONPATH=. python3 benchmarks/gpu_agreement.py [--json $OUT/agreement.json]

For each model and precision class, one real training step (after a warm-up step) runs on the GPU
under the same recording dispatch mode the tracer uses, so both sides are seen at the same level (aten
ops after autocast and autograd). Both are reduced to their kernels (free view ops dropped, names
canonicalised, the dtype each kernel runs in) and compared:
- ``match``: the share of kernels whose (op, dtype) has a partner on the other side (multiset overlap
  over the larger of the two counts), the issue's target being >= 99%;
- the largest differences, so a disagreement says what to fix.
Models are the benchmark's families at 2 layers where a full model would not fit a step's memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gnn_ptp import ops  # noqa: E402
from gnn_ptp.collect import make_optimizer  # noqa: E402
from gnn_ptp.precision import get_precision  # noqa: E402
from gnn_ptp.spec import Shape, build, parse_spec  # noqa: E402
from gnn_ptp.trace import StepConfig, _flat_tensors, trace_step, written_tensors  # noqa: E402

MODELS = {
    "llama-7b-width-2-layers": ("hf:llama", ["num_hidden_layers=2"], Shape(1, 1024)),
    "gpt2-2-layers": ("hf:gpt2", ["n_layer=2"], Shape(4, 1024)),
    "bert-base": ("hf:bert", [], Shape(8, 512)),
    "resnet-50": ("torchvision:resnet50", [], Shape(16, None, 224)),
    "vit-b-16": ("torchvision:vit_b_16", [], Shape(16, None, 224)),
}
SMALL = {
    "llama-7b-width-2-layers": ("hf:llama", ["num_hidden_layers=2", "hidden_size=128", "intermediate_size=256",
                                             "num_attention_heads=4", "num_key_value_heads=2", "vocab_size=1000"],
                                Shape(2, 64)),
    "gpt2-2-layers": ("hf:gpt2", ["n_layer=2", "n_embd=128", "n_head=4", "vocab_size=1000"], Shape(2, 64)),
    "bert-base": ("hf:bert", ["num_hidden_layers=2", "hidden_size=128", "num_attention_heads=4",
                              "intermediate_size=256", "vocab_size=1000"], Shape(2, 64)),
    "resnet-50": ("torchvision:resnet18", [], Shape(2, None, 32)),
    "vit-b-16": ("hf:vit", ["num_hidden_layers=2", "hidden_size=96", "num_attention_heads=3",
                            "intermediate_size=192", "patch_size=8"], Shape(2, None, 32)),
}
PRECISIONS = ("fp32", "tf32", "torch-default", "amp-fp16", "amp-bf16", "bf16")


def kernels(nodes, precision) -> list[tuple[str, str, str]]:
    """(phase, canonical op, dtype it runs in) of every kernel node."""
    out = []
    for node in nodes:
        op = ops.canonical(node.target)
        if op in ops.FREE_OPS:
            continue
        cost = ops.op_cost(node, precision)
        out.append((node.meta.get("phase", "?"), cost.op, cost.dtype))
    return out


class _PhaseRecorder(TorchDispatchMode):
    """Each kernel's (phase, canonical op, dtype), computed as it runs. Unlike the tracer's recorder it
    keeps no tensor alive: a held gradient would make autograd copy it instead of stealing it, and
    the comparison would count kernels a real step never runs."""

    def __init__(self, device: str, precision):
        super().__init__()
        self.phase, self.device, self.precision, self.kernels = "forward", device, precision, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "prim" or ops.canonical(func) in ops.FREE_OPS:
            return out
        written = written_tensors(func, args, kwargs)
        val = out if _flat_tensors(out) else written
        tensors = _flat_tensors((args, kwargs)) + _flat_tensors(val)
        if any(t.device.type == self.device for t in tensors):  # host-side ops are no kernels
            node = SimpleNamespace(target=func, meta={"in": (args, kwargs), "val": val})
            cost = ops.op_cost(node, self.precision)
            self.kernels.append((self.phase, cost.op, cost.dtype))
        return out


def real_step(spec, shape, precision_name: str, device: str) -> list[tuple[str, str, str]]:
    precision = get_precision(precision_name)
    workload = build(spec, shape, device, precision.param_dtype)
    model = workload.model
    optimizer = make_optimizer("adamw", model.parameters())
    scaler = torch.amp.GradScaler(device) if precision.grad_scaler else None
    autocast = dict(device_type=device, dtype=precision.autocast_dtype or torch.float32,
                    enabled=precision.uses_autocast)

    def step(recorder=None):
        with precision.backend_flags(), (recorder or _null()):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(**autocast):
                loss = workload.loss_fn(model(*workload.args, **workload.kwargs), **workload.targets)
            if recorder:
                recorder.phase = "backward"
            (scaler.scale(loss) if scaler else loss).backward()
            if recorder:
                recorder.phase = "optimizer"
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up: the optimizer state exists, as in every later step
    for _ in range(30):  # and, under amp-fp16, until the GradScaler stops skipping steps on overflow
        if scaler is None:
            break
        before = scaler.get_scale()
        step()
        if scaler.get_scale() == before:
            break
    recorder = _PhaseRecorder(device, precision)
    step(recorder)
    return recorder.kernels


def _null():
    import contextlib

    return contextlib.nullcontext()


def compare(real: list, emulated: list) -> dict:
    a, b = Counter((op, dt) for _, op, dt in real), Counter((op, dt) for _, op, dt in emulated)
    overlap = sum((a & b).values())
    diff = sorted(((k, a[k] - b[k]) for k in set(a) | set(b) if a[k] != b[k]), key=lambda kv: -abs(kv[1]))
    return {"real_kernels": len(real), "traced_kernels": len(emulated),
            "match": overlap / max(len(real), len(emulated)),
            "largest_differences": [{"op": k[0], "dtype": k[1], "real_minus_traced": d} for k, d in diff[:8]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--precisions", nargs="*", default=list(PRECISIONS), choices=list(PRECISIONS))
    p.add_argument("--json", help="write every comparison here")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu checks this script itself: a real CPU step against the target=cpu trace")
    p.add_argument("--small", action="store_true", help="tiny versions of the models (for --device cpu)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_agreement.py needs a CUDA GPU (or --device cpu to check the script)")
    print(f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, torch {torch.__version__}")
    print(f"{'model':<26}{'precision':<15}{'real':>7}{'traced':>8}{'match':>8}  largest differences")
    results = []
    for name in args.models:
        spec_name, overrides, shape = SMALL[name] if args.small else MODELS[name]
        spec = parse_spec(spec_name, overrides)
        for precision in args.precisions:
            try:
                real = real_step(spec, shape, precision, args.device)
            except torch.cuda.OutOfMemoryError:
                print(f"{name:<26}{precision:<15} out of memory")
                continue
            finally:
                if args.device == "cuda":
                    torch.cuda.empty_cache()
            traced = trace_step(StepConfig(spec, shape, precision, target=args.device))
            emulated = kernels([n for n in traced.graph.nodes if n.op == "call_function"],
                               get_precision(precision))
            r = {"model": name, "precision": precision, **compare(real, emulated)}
            results.append(r)
            top = ", ".join(f"{d['op']}/{d['dtype']} {d['real_minus_traced']:+d}" for d in r["largest_differences"][:3])
            print(f"{name:<26}{precision:<15}{r['real_kernels']:>7}{r['traced_kernels']:>8}{r['match']:>7.1%}  {top}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if results:
        print(f"\nworst match {min(r['match'] for r in results):.1%}; target >= 99% for every model")


if __name__ == "__main__":
    main()
