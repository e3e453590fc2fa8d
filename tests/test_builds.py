"""Both torch builds give the same graph: the CUDA wheel (this interpreter) and the CPU-only wheel.

CI installs the CPU-only wheel (torch 2.13.0+cpu) beside the main environment and points
GNN_PTP_OTHER_PYTHON at it; the test traces the same small models in both interpreters and compares
every kernel node: canonical op, the dtype it runs in, its output shape and its phase.

The two wheels are also two torch versions, and one H100 kernel choice changed between them: torch 2.14's
memory-efficient attention takes grouped-query attention, 2.13's does not (the math path runs). Graphs
that hit that choice (Llama's GQA attention in fp32, where flash attention cannot run) are checked for
exactly that difference instead of equality.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

OTHER = os.environ.get("GNN_PTP_OTHER_PYTHON")
CASES = [
    ("hf:gpt2", ["n_layer=1", "n_embd=64", "n_head=2", "vocab_size=500"], [2, 32, None]),
    ("hf:bert", ["num_hidden_layers=1", "hidden_size=64", "num_attention_heads=2", "intermediate_size=128",
                 "vocab_size=500"], [2, 32, None]),
    ("hf:llama", ["num_hidden_layers=1", "hidden_size=64", "intermediate_size=128", "num_attention_heads=4",
                  "num_key_value_heads=2", "vocab_size=500"], [2, 32, None]),
    ("hf:t5", ["d_model=64", "d_ff=128", "num_layers=1", "num_decoder_layers=1", "num_heads=2", "d_kv=32",
               "vocab_size=500"], [2, 16, None]),
    ("random:cnn", [], [2, None, 32]),
    ("random:transformer", ["vocab_size=500"], [2, 32, None]),
]
PRECISIONS = ["fp32", "amp-fp16", "amp-bf16", "bf16"]

SCRIPT = r'''
import json, sys, warnings
warnings.filterwarnings("ignore")
from gnn_ptp import ops
from gnn_ptp.precision import get_precision
from gnn_ptp.spec import Shape, parse_spec
from gnn_ptp.trace import StepConfig, trace_step
import torch
cases, precisions = json.loads(sys.argv[1]), json.loads(sys.argv[2])
from gnn_ptp.cuda_dispatch import efficient_attention_supports_gqa
out = {"torch": torch.__version__, "efficient_gqa": efficient_attention_supports_gqa(), "graphs": {}}
for spec, overrides, (b, s, i) in cases:
    if spec.startswith("random:"):
        spec = spec + ":3"
    for p in precisions:
        traced = trace_step(StepConfig(parse_spec(spec, overrides), Shape(b, s, i), p))
        rows = []
        for node in traced.graph.nodes:
            if node.op != "call_function" or ops.canonical(node.target) in ops.FREE_OPS:
                continue
            c = ops.op_cost(node, get_precision(p))
            rows.append([c.op, c.dtype, list(c.out_shape), node.meta["phase"]])
        out["graphs"][f"{spec} {p}"] = rows
print(json.dumps(out))
'''


def _fingerprints(python: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([python, "-c", SCRIPT, json.dumps(CASES), json.dumps(PRECISIONS)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not OTHER, reason="GNN_PTP_OTHER_PYTHON (an interpreter with the other torch build) is "
                                      "not set; .ci/run sets it")
def test_cuda_wheel_and_cpu_wheel_trace_the_same_graph():
    mine, theirs = _fingerprints(sys.executable), _fingerprints(OTHER)
    assert mine["torch"] != theirs["torch"], "both interpreters have the same torch build"
    for key, rows in mine["graphs"].items():
        other = theirs["graphs"][key]
        if key == "hf:llama fp32" and mine["efficient_gqa"] != theirs["efficient_gqa"]:
            with_gqa, without = (rows, other) if mine["efficient_gqa"] else (other, rows)
            assert [r[0] for r in with_gqa].count("efficient_attention") == 1, key
            assert [r[0] for r in without].count("efficient_attention") == 0, key
            continue
        assert len(rows) == len(other), f"{key}: {len(rows)} kernels with torch {mine['torch']}, " \
                                        f"{len(other)} with {theirs['torch']}"
        for i, (a, b) in enumerate(zip(rows, other)):
            assert a == b, f"{key} kernel {i}: {a} (torch {mine['torch']}) != {b} (torch {theirs['torch']})"
