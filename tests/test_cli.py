"""The command line, called in-process: output, --json, --out, one-line errors with exit code 2, --debug."""

from __future__ import annotations

import json

import pytest
import torch

from gnn_ptp import cli, graph
from gnn_ptp.errors import UserError
from gnn_ptp.precision import PRECISION_NAMES

from conftest import GPT2, PYMODELS

TINY_GPT2 = [GPT2[0]] + [a for kv in GPT2[1] for a in ("--set", kv)] + ["--batch-size", "2", "--seq-len", "16"]

SUMMARY_KEYS = {"spec", "family", "batch_size", "seq_len", "image_size", "precision", "optimizer", "target",
                "params", "traced_ops", "nodes", "edges", "flops", "flops_by_phase", "bytes_by_phase",
                "kernels_by_phase", "flops_by_dtype", "bytes_by_dtype", "tensor_core_flop_share", "unseen_ops",
                "trace_s", "feature_version"}


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_graph_prints_summary(capsys):
    code, out, err = run(capsys, "graph", *TINY_GPT2, "--precision", "amp-fp16")
    assert code == 0
    assert out.startswith("hf:gpt2")
    assert "family gpt2" in out and "batch 2 x seq 16" in out
    assert "precision amp-fp16" in out and "GradScaler" in out
    for phase in ("forward", "backward", "optimizer", "total"):
        assert f"\n{phase}" in out
    assert "fp16" in out and "tensor cores:" in out


def test_graph_json(capsys):
    code, out, _ = run(capsys, "graph", *TINY_GPT2, "--json", "--optimizer", "sgd")
    assert code == 0
    d = json.loads(out)
    assert SUMMARY_KEYS <= set(d)
    assert d["precision"] == "amp-bf16" and d["optimizer"] == "sgd" and d["target"] == "cuda"  # defaults
    assert d["spec"] == {"spec": "hf:gpt2", "set": {"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 500},
                         "task": None}
    assert d["batch_size"] == 2 and d["seq_len"] == 16 and d["image_size"] is None
    assert d["nodes"] > 50 and d["edges"] > d["nodes"] and d["traced_ops"] > d["nodes"]
    assert set(d["kernels_by_phase"]) == {"forward", "backward", "optimizer"}
    assert d["flops"] == pytest.approx(sum(d["flops_by_phase"].values()))
    assert d["feature_version"] == graph.feature_version("cuda") == graph.FEATURE_VERSION


def test_graph_cpu_target(capsys):
    code, out, _ = run(capsys, "graph", *TINY_GPT2, "--json", "--target", "cpu", "--precision", "fp32")
    assert code == 0 and json.loads(out)["target"] == "cpu"


def test_graph_out_writes_pyg_data(capsys, tmp_path):
    path = tmp_path / "sub" / "g.pt"
    code, out, _ = run(capsys, "graph", *TINY_GPT2, "--out", str(path))
    assert code == 0 and f"graph saved to {path}" in out
    data = torch.load(path, weights_only=False)
    from torch_geometric.data import Data

    assert isinstance(data, Data)
    assert data.x.shape[1] == graph.NODE_FEATURES and data.u.shape == (1, graph.GRAPH_FEATURES)
    assert data.num_nodes == data.x.shape[0] == data.x_cat.shape[0]
    assert int(data.edge_index.max()) < data.num_nodes
    assert not list(tmp_path.joinpath("sub").glob(".*tmp"))  # written atomically, no leftovers


def test_graph_py_spec(capsys):
    code, out, _ = run(capsys, "graph", f"py:{PYMODELS}:mlp2", "--set", "hidden=16", "--batch-size", "4",
                       "--precision", "fp32", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["family"] == "custom-mlp2" and d["spec"]["set"] == {"hidden": 16}


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("gnn-ptp graph: error: ")
    return lines[0]


@pytest.mark.parametrize("argv, must_contain", [
    (["hff:gpt2"], ["'hff'", "hf, torchvision, timm, py, random", "did you mean 'hf'"]),
    (["gpt2"], ["'gpt2'", "<source>:<name>"]),
    (["hf:gpt3"], ["'gpt3'", "'gpt2'"]),
    (["torchvision:resnet19"], ["resnet19", "'resnet18'"]),
    (["random:mlpp:1"], ["'mlpp'", "transformer, cnn, mlp"]),
    (TINY_GPT2 + ["--precision", "fp64"], ["'fp64'", ", ".join(PRECISION_NAMES)]),
    (TINY_GPT2 + ["--precision", "amp_bf16"], ["did you mean 'amp-bf16'"]),
    (TINY_GPT2 + ["--set", "n_layr=2"], ["n_layr", "did you mean 'n_layer'"]),
    (TINY_GPT2 + ["--set", "n_layer"], ["'n_layer'", "key=value"]),
    (TINY_GPT2 + ["--optimizer", "adamx"], ["'adamx'", "adamw, adam, sgd"]),
    (TINY_GPT2 + ["--task", "causal"], ["'causal'", "causal-lm"]),
    (["hf:gpt2", "--set", "n_layer=1", "--seq-len", "4096"], ["4096", "max_position_embeddings"]),
])
def test_user_errors_are_one_line_exit_2(capsys, argv, must_contain):
    code, out, err = run(capsys, "graph", *argv)
    assert code == 2
    line = _one_line_error(err)
    for text in must_contain:
        assert text in line, (text, line)
    assert out == ""


def test_debug_reraises(capsys):
    with pytest.raises(UserError, match="did you mean 'hf'"):
        cli.main(["--debug", "graph", "hff:gpt2"])


def test_trace_failure_is_exit_1(capsys):
    code, _, err = run(capsys, "graph", f"py:{PYMODELS}:data_dependent", "--precision", "fp32",
                       "--batch-size", "2")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "could not trace" in lines[0] and "--debug" in lines[0]
    from gnn_ptp.trace import TraceError

    with pytest.raises(TraceError):
        cli.main(["--debug", "graph", f"py:{PYMODELS}:data_dependent", "--precision", "fp32"])


def test_argparse_rejects_bad_numbers(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["graph", *TINY_GPT2, "--batch-size", "0"])
    assert e.value.code == 2
    assert "out of range: allowed 1 to" in capsys.readouterr().err


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    from gnn_ptp import __version__

    assert __version__ in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main([])  # a command is required
    assert "COMMAND" in capsys.readouterr().err
