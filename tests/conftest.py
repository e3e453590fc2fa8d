"""Shared fixtures: tiny real models (built on the meta device by the code under test), shapes and helpers.

Every model here is small enough that tracing one training step takes well under a second once torch
and transformers are imported. Tests marked ``slow`` (tracing a Llama-7B config...) are skipped unless
``--run-slow`` is given or a ``-m`` expression selects them (``pytest -m slow``); tests that need a GPU
carry ``needs_gpu`` and are skipped without one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from gnn_ptp.spec import ModelSpec, Shape, parse_spec
from gnn_ptp.trace import StepConfig, trace_step

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the per-graph cache predict, train and evaluate share: one fresh folder per test session, never ~/.cache
os.environ.setdefault("GNN_PTP_CACHE", __import__("tempfile").mkdtemp(prefix="gnn-ptp-test-cache-"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

TESTS = Path(__file__).resolve().parent
PYMODELS = TESTS / "pymodels.py"
"""Factories for ``py:`` specs (closed-form FLOP checks, the factory contract)."""

def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


LONGEST_FIRST = (
    # the longest tests on a cold cache (seconds on a 2-core VM, two workers; README *Development*) start
    # first, so that with --dist worksteal the other worker takes the rest and both finish together
    "evaluate --checkpoint checkpoints/h200",  # ~380-640 s: traces its 162 held-out configurations
    "evaluate --checkpoint checkpoints/cpu",  # ~150 s
    "test_device_image_preflight",  # ~75 s
    "test_kernel_classes_give_the_optimizer_phase",  # ~45 s
    "test_cuda_wheel_and_cpu_wheel_trace_the_same_graph",  # ~40 s
    "test_calibrate_comm_with_real_gloo_processes",  # ~40 s
)


def _start_rank(item) -> int:
    return next((i for i, part in enumerate(LONGEST_FIRST) if part in item.nodeid), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_rank)  # stable: the others keep their order
    if config.getoption("--run-slow") or config.option.markexpr:
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow or -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_cuda_wheel = pytest.mark.skipif(torch.version.cuda is None,
                                      reason="needs the CUDA build of torch (AutocastCUDA kernels)")

# (spec, --set overrides): tiny versions of the zoo models
GPT2 = ("hf:gpt2", ["n_layer=1", "n_embd=64", "n_head=2", "vocab_size=500"])
BERT = ("hf:bert", ["num_hidden_layers=1", "hidden_size=64", "num_attention_heads=2",
                    "intermediate_size=128", "vocab_size=500"])
# GQA: 4 query heads, 2 key/value heads. head_dim is explicit because the config's default (128) is not
# re-derived from hidden_size / num_attention_heads when --set changes them (see test_spec).
LLAMA = ("hf:llama", ["num_hidden_layers=1", "hidden_size=64", "intermediate_size=128",
                      "num_attention_heads=4", "num_key_value_heads=2", "head_dim=16", "vocab_size=500"])
RESNET18 = ("torchvision:resnet18", [])
RANDOM_MLP = ("random:mlp:3", ["in_features=32", "width=64", "depth=3", "num_classes=10", "dropout=0.1",
                               "norm=layernorm"])
RANDOM_CNN = ("random:cnn:3", ["base_width=16", "num_classes=10"])  # batch norm, depthwise convs
RANDOM_TRANSFORMER = ("random:transformer:0", ["vocab_size=500", "depth=1", "heads=2", "d_model=64",
                                               "norm=rmsnorm", "dropout=0.1", "classify=false",
                                               "causal=true"])

TEXT = Shape(2, 16)
VISION = Shape(2, None, 32)
TABULAR = Shape(4)


def spec_of(model: tuple[str, list[str]], *extra: str) -> ModelSpec:
    spec, overrides = model
    return parse_spec(spec, list(overrides) + list(extra))


def step(model, shape: Shape, precision: str, optimizer: str = "adamw", target: str = "cuda",
         extra: tuple[str, ...] = ()):
    """Trace one training step of a tiny model (cached by the tracer)."""
    return trace_step(StepConfig(spec_of(model, *extra), shape, precision, optimizer, target))


def py_spec(factory: str, **overrides) -> ModelSpec:
    return parse_spec(f"py:{PYMODELS}:{factory}", {k: v for k, v in overrides.items()})


@pytest.fixture(scope="session")
def gpt2_spec() -> ModelSpec:
    return spec_of(GPT2)


@pytest.fixture(scope="session")
def bert_spec() -> ModelSpec:
    return spec_of(BERT)


@pytest.fixture(scope="session")
def llama_spec() -> ModelSpec:
    return spec_of(LLAMA)


@pytest.fixture(scope="session")
def resnet18_spec() -> ModelSpec:
    return spec_of(RESNET18)


@pytest.fixture(scope="session")
def random_mlp_spec() -> ModelSpec:
    return spec_of(RANDOM_MLP)


@pytest.fixture(scope="session")
def random_cnn_spec() -> ModelSpec:
    return spec_of(RANDOM_CNN)


@pytest.fixture(scope="session")
def random_transformer_spec() -> ModelSpec:
    return spec_of(RANDOM_TRANSFORMER)


def benchmark_module(name: str):
    """benchmarks/<name>.py loaded as a module (a script, not part of the package)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calibrate_prior_module():
    """benchmarks/calibrate_prior.py loaded as a module."""
    return benchmark_module("calibrate_prior")


def compute_nodes(traced, phase: str | None = None):
    """call_function nodes that launch a kernel (no views, getitem, detach...), optionally one phase."""
    from gnn_ptp import ops

    return [n for n in traced.graph.nodes
            if n.op == "call_function" and ops.canonical(n.target) not in ops.FREE_OPS
            and (phase is None or n.meta.get("phase") == phase)]


def out_dtypes(node) -> list[torch.dtype]:
    """Dtypes of what a node produced (or wrote in place)."""
    from gnn_ptp.ops import _tensors

    return [t.dtype for t in _tensors(node.meta.get("val"))]


def nodes_named(traced, op: str, phase: str | None = None):
    from gnn_ptp import ops

    return [n for n in compute_nodes(traced, phase) if ops.canonical(n.target) == op]
