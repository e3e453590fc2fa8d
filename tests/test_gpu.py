"""Checks that need a CUDA GPU (skipped without one): the emulated trace against a real GPU step, and the
collector on a GPU.

NOTE: written on a machine without a GPU, so never run yet. The comparison reports every difference
in its failure message; expect the first run on an H100 to tell us things (the SDPA kernel was one: the
H200 run of 2026-11-24 showed torch 2.11 running cuDNN attention on sm90, which the emulation now records,
see cuda_dispatch).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gnn_ptp import ops
from gnn_ptp.precision import get_precision
from gnn_ptp.spec import build

from conftest import BERT, GPT2, RANDOM_CNN, RESNET18, TEXT, VISION, compute_nodes, needs_gpu, out_dtypes, spec_of, step

pytestmark = [needs_gpu, pytest.mark.gpu]

MODELS = {"gpt2": (GPT2, TEXT), "bert": (BERT, TEXT), "random-cnn": (RANDOM_CNN, VISION),
          "resnet18": (RESNET18, VISION)}


def _dtype(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def _real_step_ops(model, shape, precision_name: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(phase, canonical op, output dtypes) of forward + loss + backward on the real GPU."""
    from real_cuda_autocast import Recorder

    precision = get_precision(precision_name)
    workload = build(spec_of(model), shape, "cuda", precision.param_dtype)
    params = [p for p in workload.model.parameters() if p.requires_grad]
    recorder = Recorder()
    phases: list[int] = []
    with precision.backend_flags(), recorder:
        with torch.autocast("cuda", dtype=precision.autocast_dtype or torch.float32,
                            enabled=precision.uses_autocast):
            output = workload.model(*workload.args, **workload.kwargs)
            loss = workload.loss_fn(output, **workload.targets)
        if precision.grad_scaler:
            loss = loss * torch.full((), 65536.0, device="cuda")
        phases.append(len(recorder.ops))
        torch.autograd.grad(loss, params, allow_unused=True)
    torch.cuda.synchronize()
    n_forward = phases[0]
    return [("forward" if i < n_forward else "backward", op, d) for i, (op, d) in enumerate(recorder.ops)]


def _emulated_step_ops(model, shape, precision_name: str):
    traced = step(model, shape, precision_name)
    out = []
    for n in compute_nodes(traced):
        if n.meta["phase"] == "optimizer":
            continue
        out.append((n.meta["phase"], ops.canonical(n.target), tuple(_dtype(d) for d in out_dtypes(n))))
    return out


@pytest.mark.parametrize("precision", ["amp-bf16", "amp-fp16", "bf16", "fp32"])
@pytest.mark.parametrize("name", list(MODELS))
def test_trace_matches_a_real_gpu_step(name, precision):
    model, shape = MODELS[name]
    real = _real_step_ops(model, shape, precision)
    ours = _emulated_step_ops(model, shape, precision)
    problems = []
    for phase in ("forward", "backward"):
        r = Counter((op, d) for p, op, d in real if p == phase)
        o = Counter((op, d) for p, op, d in ours if p == phase)
        if r != o:
            problems.append(f"{phase}: only on the GPU: {dict(r - o)}; only in the trace: {dict(o - r)}")
    assert not problems, f"{name} {precision}:\n" + "\n".join(problems)


def test_collect_on_gpu(tmp_path):
    from gnn_ptp import records
    from gnn_ptp.collect import CollectConfig, collect

    grid = tmp_path / "g.toml"
    grid.write_text('precisions = ["amp-fp16", "tf32"]\n[[model]]\nspec = "random:mlp:3"\nbatch_size = [8]\n')
    hardware = records.hardware_label(torch.cuda.get_device_name(0))
    out = tmp_path / hardware
    counts = collect(CollectConfig(str(grid), str(out), device="cuda", warmup_steps=2, min_steps=5,
                                   min_time_s=0.05, max_time_s=1.0))
    assert counts["ok"] == 2
    for r in records.iter_records(out):
        assert r["timing"]["clock"] == "cuda_events"
        assert r["memory"]["kind"] == "cuda_max_memory_allocated" and r["memory"]["peak_bytes"] > 0
        assert r["env"]["hardware"] == hardware and r["env"]["cuda"]
