"""Layer replication (gnn_ptp/replicate.py) gives exactly the graph of a full trace.

Every model type replication is allowed for, in every precision class and on both trace targets: the
PyG graph built from the replicated trace must equal, tensor for tensor, the one built from tracing all
layers. Tiny widths keep it fast; the depth (8 layers) is what replication is about.
"""

import dataclasses
import os

import pytest
import torch

from conftest import needs_cuda_wheel
from gnn_ptp import memory, replicate, trace
from gnn_ptp.graph import to_data
from gnn_ptp.precision import get_precision
from gnn_ptp.spec import Shape, build, parse_spec
from gnn_ptp.trace import StepConfig

LAYERS = 8
TEXT, VISION = Shape(2, 16), Shape(2, None, 32)
DECODER = ["hidden_size=64", "intermediate_size=128", "num_attention_heads=4", "num_key_value_heads=2",
           "head_dim=16", "vocab_size=500"]
MODELS = {
    "llama": ("hf:llama", [f"num_hidden_layers={LAYERS}", *DECODER], TEXT),
    "mistral": ("hf:mistral", [f"num_hidden_layers={LAYERS}", *DECODER], TEXT),
    "qwen2": ("hf:qwen2", [f"num_hidden_layers={LAYERS}", *[o for o in DECODER if not o.startswith("head_dim")]],
              TEXT),  # no head_dim field: hidden_size / num_attention_heads
    "gpt2": ("hf:gpt2", [f"n_layer={LAYERS}", "n_embd=64", "n_head=2", "vocab_size=500"], TEXT),
    "bert": ("hf:bert", [f"num_hidden_layers={LAYERS}", "hidden_size=64", "num_attention_heads=2",
                         "intermediate_size=128", "vocab_size=500"], TEXT),
    "roberta": ("hf:roberta", [f"num_hidden_layers={LAYERS}", "hidden_size=64", "num_attention_heads=2",
                               "intermediate_size=128", "vocab_size=500"], TEXT),
    "opt": ("hf:opt", [f"num_hidden_layers={LAYERS}", "hidden_size=64", "ffn_dim=128", "num_attention_heads=2",
                       "word_embed_proj_dim=64", "vocab_size=500"], TEXT),
    "vit": ("hf:vit", [f"num_hidden_layers={LAYERS}", "hidden_size=64", "num_attention_heads=2",
                       "intermediate_size=128", "patch_size=8"], VISION),
}


def _full_trace(config: StepConfig):
    os.environ["GNN_PTP_REPLICATE"] = "0"
    try:
        return trace._trace_cached.__wrapped__(config)
    finally:
        os.environ.pop("GNN_PTP_REPLICATE")


def _replicated_trace(config: StepConfig):
    workload = build(config.spec, config.shape, "meta", get_precision(config.precision).param_dtype)
    traced = replicate.trace_by_replication(config, workload, trace._record)
    assert traced is not None, f"{config.spec.spec} {config.precision} was not replicated"
    return traced


def assert_same_graph(full, replicated) -> None:
    assert len(replicated.graph.nodes) == len(full.graph.nodes)
    (a, summary_a), (b, summary_b) = to_data(full), to_data(replicated)
    assert summary_b == summary_a
    assert set(a.keys()) == set(b.keys())
    for key in a.keys():
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key
    assert replicated.param_count == full.param_count
    assert memory.estimate(replicated) == memory.estimate(full)  # liveness, held outputs, aliases


@needs_cuda_wheel
@pytest.mark.parametrize("precision", ["fp32", "amp-fp16", "amp-bf16", "bf16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_replicated_graph_equals_full_trace_on_h100_target(name, precision):
    spec, overrides, shape = MODELS[name]
    config = StepConfig(parse_spec(spec, overrides), shape, precision, "adamw", "cuda")
    assert_same_graph(_full_trace(config), _replicated_trace(config))


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_replicated_graph_equals_full_trace_on_cpu_target(name, precision):
    """The CPU target runs the optimizer one parameter at a time: per-layer optimizer ops, no foreach."""
    spec, overrides, shape = MODELS[name]
    config = StepConfig(parse_spec(spec, overrides), shape, precision, "adamw", "cpu")
    assert_same_graph(_full_trace(config), _replicated_trace(config))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_replicated_graph_equals_full_trace_for_other_optimizers(optimizer, target):
    if target == "cuda" and torch.version.cuda is None:
        pytest.skip("needs the CUDA build of torch (AutocastCUDA kernels)")
    spec, overrides, shape = MODELS["llama"]
    config = StepConfig(parse_spec(spec, overrides), shape, "amp-fp16", optimizer, target)
    assert_same_graph(_full_trace(config), _replicated_trace(config))


# --- where it must not replicate: the full trace is taken instead ------------------------------------


def test_layers_of_different_kinds_are_traced_whole():
    """Qwen2 with sliding-window attention from layer 4 on: the stack is not uniform, so no plan."""
    spec, overrides, shape = MODELS["qwen2"]
    extra = ["use_sliding_window=true", "max_window_layers=4", "sliding_window=8"]
    workload = build(parse_spec(spec, overrides + extra), shape, "meta")
    assert len(set(workload.model.config.layer_types)) == 2
    assert replicate.plan(workload) is None


def test_layers_that_differ_in_a_constant_are_refused_by_the_layer_check():
    """GPT-2 scaling attention by 1 / layer index: same ops, different scale per layer. The plan allows
    the model type, the five-layer trace shows the difference, and the full trace is used."""
    spec, overrides, shape = MODELS["gpt2"]
    config = StepConfig(parse_spec(spec, overrides + ["scale_attn_by_inverse_layer_idx=true"]), shape, "amp-bf16")
    workload = build(config.spec, config.shape, "meta")
    stack, key, n_layers = replicate.plan(workload)
    small = build(dataclasses.replace(config.spec, overrides=config.spec.overrides + ((key, 5),)), shape, "meta")
    with pytest.raises(replicate.NotReplicable, match="differs"):
        replicate.synthesize(trace._record(config, small, stack), n_layers)
    assert replicate.trace_by_replication(config, workload, trace._record) is None


def test_shallow_models_and_other_sources_are_traced_whole():
    spec, overrides, shape = MODELS["llama"]
    shallow = build(parse_spec(spec, overrides + [f"num_hidden_layers={replicate.MIN_LAYERS - 1}"]), shape, "meta")
    assert replicate.plan(shallow) is None
    t5 = build(parse_spec("hf:t5", ["d_model=64", "d_ff=128", "num_layers=8", "num_decoder_layers=8", "num_heads=2",
                                    "d_kv=32", "vocab_size=500"]), Shape(2, 16), "meta")
    assert replicate.plan(t5) is None  # two stacks (encoder, decoder), and not on the checked list


def test_trace_step_replicates_deep_models_unless_turned_off(monkeypatch):
    calls = []
    real = replicate.synthesize
    monkeypatch.setattr(replicate, "synthesize", lambda graph, n: calls.append(n) or real(graph, n))
    spec, overrides, shape = MODELS["gpt2"]
    config = StepConfig(parse_spec(spec, overrides + ["n_embd=32"]), shape, "fp32", "sgd", "cpu")
    replicated = trace.trace_step(config)
    assert calls == [LAYERS]
    trace._trace_cached.cache_clear()
    monkeypatch.setenv("GNN_PTP_REPLICATE", "0")
    full = trace.trace_step(config)
    assert calls == [LAYERS]
    assert_same_graph(full, replicated)


@needs_cuda_wheel
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["amp-fp16", "fp32"])
def test_llama_7b_replicated_equals_full_trace(precision):
    """The README's benchmark model at its shape: 32 layers built from 5, equal to the 32-layer trace."""
    config = StepConfig(parse_spec("hf:llama"), Shape(4, 2048), precision, "adamw", "cuda")
    assert_same_graph(_full_trace(config), _replicated_trace(config))
