"""Every user mistake, on every subcommand: exit code 2, exactly one line on stderr,
``gnn-ptp <cmd>: error: ...`` naming the input, and no traceback.

The cases run in-process through ``gnn_ptp.cli.main`` (fast); a few run as real processes at the end.
``{t}`` in a case is the folder of bad files built once for the module (``bad_files``); ``{tests}`` is
this folder. The second item of a case is a text the error line must contain: the input it names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gnn_ptp import cli

from fresh_process import run_fresh
from user_models import line_of

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CPU_RECORDS = REPO / "datasets" / "cpu" / "cpu.jsonl"
UM = "py:{tests}/user_models.py"
GPT2 = ["hf:gpt2", "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2", "--set", "vocab_size=100",
        "--batch-size", "2", "--seq-len", "16"]
P = ["predict", *GPT2, "--hardware", "cpu"]
DATA = ["--data", "{t}/good"]

# (id, argv, text the error line names)
CASES = [
    # --- the command line itself
    ("no-command", [], "COMMAND"),
    ("unknown-command", ["frobnicate"], "frobnicate"),
    ("unknown-global-flag", ["--bogus", "graph", "hf:gpt2"], "--bogus"),
    # --- graph: model specs
    ("graph-no-spec", ["graph"], "spec"),
    ("graph-spec-no-source", ["graph", "gpt2"], "gpt2"),
    ("graph-typo-model", ["graph", "hf:gtp2"], "gpt2"),
    ("graph-unknown-source", ["graph", "foo:bar"], "foo"),
    ("graph-empty-name", ["graph", "hf:"], "hf:"),
    ("graph-set-wrong-type", ["graph", "hf:gpt2", "--set", "n_layer=abc"], "n_layer=abc"),
    ("graph-set-not-kv", ["graph", "hf:gpt2", "--set", "n_layer"], "n_layer"),
    ("graph-set-no-key", ["graph", "hf:gpt2", "--set", "=3"], "=3"),
    ("graph-set-unknown-field", ["graph", "hf:gpt2", "--set", "n_layerz=3"], "n_layerz"),
    ("graph-set-attn", ["graph", "hf:gpt2", "--set", "attn_implementation=magic"], "magic"),
    ("graph-batch-zero", ["graph", "hf:gpt2", "--batch-size", "0"], "--batch-size"),
    ("graph-batch-negative", ["graph", "hf:gpt2", "--batch-size", "-3"], "--batch-size"),
    ("graph-batch-1e9", ["graph", "hf:gpt2", "--batch-size", "1e9"], "1048576"),
    ("graph-batch-huge", ["graph", "hf:gpt2", "--batch-size", "1000000000"], "1048576"),
    ("graph-batch-text", ["graph", "hf:gpt2", "--batch-size", "abc"], "abc"),
    ("graph-seq-zero", ["graph", "hf:gpt2", "--seq-len", "0"], "--seq-len"),
    ("graph-seq-huge", ["graph", "hf:gpt2", "--seq-len", "99999999999"], "--seq-len"),
    ("graph-seq-over-positions", ["graph", "hf:gpt2", "--seq-len", "4096"], "4096"),
    ("graph-image-huge", ["graph", "torchvision:resnet18", "--image-size", "100000"], "--image-size"),
    ("graph-precision", ["graph", "hf:gpt2", "--precision", "fp8"], "fp8"),
    ("graph-optimizer", ["graph", "hf:gpt2", "--optimizer", "lion"], "lion"),
    ("graph-target", ["graph", "hf:gpt2", "--target", "tpu"], "tpu"),
    ("graph-task-unknown", ["graph", "hf:gpt2", "--task", "translation"], "translation"),
    ("graph-task-not-hf", ["graph", "torchvision:resnet18", "--task", "causal-lm"], "torchvision:resnet18"),
    ("graph-task-no-head", ["graph", "hf:vit", "--task", "causal-lm"], "causal-lm"),
    ("graph-torchvision-typo", ["graph", "torchvision:resnet19"], "resnet18"),
    ("graph-torchvision-set", ["graph", "torchvision:resnet18", "--set", "bogus=1"], "bogus"),
    ("graph-timm-unknown", ["graph", "timm:no_such_model_xyz"], "no_such_model_xyz"),
    ("graph-random-kind", ["graph", "random:rnn:1"], "rnn"),
    ("graph-random-seed", ["graph", "random:mlp:abc"], "abc"),
    ("graph-random-set", ["graph", "random:mlp:1", "--set", "bogus=1"], "bogus"),
    ("graph-set-heads-indivisible", ["graph", "hf:gpt2", "--set", "n_layer=1", "--set", "n_embd=64", "--set",
                                     "n_head=5", "--batch-size", "2", "--seq-len", "16"], "n_head=5"),
    ("graph-set-negative-layers", ["graph", "hf:gpt2", "--set", "n_layer=-1", "--set", "n_embd=64", "--set",
                                   "n_head=2", "--batch-size", "2", "--seq-len", "16"], "n_layer=-1"),
    ("graph-set-zero-width", ["graph", "hf:gpt2", "--set", "n_layer=1", "--set", "n_embd=0",
                              "--batch-size", "2", "--seq-len", "16"], "n_embd=0"),
    ("graph-vit-image-not-patches", ["graph", "torchvision:vit_b_16", "--image-size", "100", "--batch-size", "2"],
     "--image-size 100"),
    ("graph-random-set-type", ["graph", "random:mlp:1", "--set", "width=abc"], "width=abc"),
    ("graph-hf-missing-json", ["graph", "hf:{t}/missing.json"], "missing.json"),
    ("graph-hf-not-json", ["graph", "hf:{t}/not_json.json"], "not_json.json"),
    ("graph-hf-json-list", ["graph", "hf:{t}/list.json"], "list.json"),
    ("graph-hf-unknown-type", ["graph", "hf:{t}/unknown_type.json"], "gtp2"),
    ("graph-hf-bad-field", ["graph", "hf:{t}/bad_field.json"], "bad_field.json"),
    ("graph-hf-folder-no-config", ["graph", "hf:{t}/empty"], "config.json"),
    ("graph-py-missing-file", ["graph", "py:{t}/missing.py:make"], "missing.py"),
    ("graph-py-no-factory", ["graph", UM], "user_models.py"),
    ("graph-py-unknown-factory", ["graph", UM + ":clasifier"], "classifier"),
    ("graph-py-not-py", ["graph", "py:{t}/model.txt:make"], "model.txt"),
    ("graph-py-factory-raises", ["graph", UM + ":raises"], f"user_models.py:{line_of('raises')}"),
    ("graph-py-shape-error", ["graph", UM + ":shape_error", "--batch-size", "4"], "user_models.py"),
    ("graph-py-forward-error", ["graph", UM + ":broken_forward"], f"user_models.py:{line_of('forward')}"),
    ("graph-py-returns-two", ["graph", UM + ":returns_two"], "returns_two()"),
    ("graph-py-not-a-module", ["graph", UM + ":not_a_module"], "torch.nn.Module"),
    ("graph-py-bad-inputs", ["graph", UM + ":bad_inputs"], "inputs"),
    ("graph-py-no-loss", ["graph", UM + ":no_loss"], "loss_fn"),
    ("graph-py-signature", ["graph", UM + ":no_kwargs"], "no_kwargs()"),
    ("graph-py-unknown-set", ["graph", UM + ":classifier", "--set", "foo=1"], "foo"),
    ("graph-py-import-error", ["graph", "py:{t}/import_error.py:make"], "import_error.py:2"),
    ("graph-py-syntax-error", ["graph", "py:{t}/syntax_error.py:make"], "syntax_error.py:1"),
    ("graph-out-folder", ["graph", "hf:gpt2", "--out", "{t}/empty"], "--out"),
    ("graph-out-under-file", ["graph", "hf:gpt2", "--out", "{t}/a_file/g.pt"], "a_file"),
    # a folder no file can be created in, whatever its permission bits say (root passes them on /proc)
    ("graph-out-proc", ["graph", "hf:gpt2", "--out", "/proc/g.pt"], "'/proc/g.pt'"),
    # --- collect (argparse and grid checks; the collector itself is tested in test_collect.py)
    ("collect-no-grid", ["collect", "--out", "{t}/o"], "--grid"),
    ("collect-no-out", ["collect", "--grid", "{t}/grid.toml"], "--out"),
    ("collect-limit-zero", ["collect", "--grid", "g.toml", "--out", "o", "--limit", "0"], "--limit"),
    ("collect-budget-negative", ["collect", "--grid", "g.toml", "--out", "o", "--budget-s", "-1"], "--budget-s"),
    ("collect-threads-text", ["collect", "--grid", "g.toml", "--out", "o", "--threads", "x"], "--threads"),
    ("collect-missing-grid", ["collect", "--grid", "{t}/missing.toml", "--out", "{t}/cpu"], "missing.toml"),
    ("collect-bad-grid", ["collect", "--grid", "{t}/not_toml.toml", "--out", "{t}/cpu"], "not_toml.toml"),
    # --- data stats
    ("data-no-subcommand", ["data"], "DATA_COMMAND"),
    ("data-stats-no-path", ["data", "stats"], "path"),
    ("data-stats-missing", ["data", "stats", "{t}/nope"], "nope"),
    ("data-stats-empty-folder", ["data", "stats", "{t}/empty"], "empty"),
    ("data-stats-all-bad", ["data", "stats", "{t}/all_bad"], "all_bad"),
    ("data-stats-strict", ["data", "stats", "{t}/some_bad", "--strict"], "some_bad.jsonl:2"),
    ("data-stats-strict-missing-field", ["data", "stats", "{t}/missing_field", "--strict"], "config.precision"),
    ("data-stats-strict-wrong-type", ["data", "stats", "{t}/wrong_type", "--strict"], "timing.step_ms.median"),
    ("data-stats-text-file", ["data", "stats", "{t}/model.txt"], "model.txt"),
    ("data-stats-min-step", ["data", "stats", "{t}/good", "--min-step-ms", "abc"], "--min-step-ms"),
    # --- train
    ("train-no-data", ["train", "--out", "{t}/ck"], "--data"),
    ("train-no-out", ["train", *DATA], "--out"),
    ("train-data-missing", ["train", "--data", "{t}/nope", "--out", "{t}/ck"], "nope"),
    ("train-out-is-file", ["train", *DATA, "--out", "{t}/a_file"], "a_file"),
    ("train-out-under-file", ["train", *DATA, "--out", "{t}/a_file/ck"], "a_file"),
    ("train-data-empty", ["train", "--data", "{t}/empty", "--out", "{t}/ck"], "empty"),
    ("train-data-all-bad", ["train", "--data", "{t}/all_bad", "--out", "{t}/ck"], "all_bad"),
    ("train-strict", ["train", "--data", "{t}/some_bad", "--out", "{t}/ck", "--strict"], "some_bad.jsonl:2"),
    ("train-epochs-zero", ["train", *DATA, "--out", "{t}/ck", "--epochs", "0"], "--epochs"),
    ("train-epochs-text", ["train", *DATA, "--out", "{t}/ck", "--epochs", "abc"], "--epochs"),
    ("train-threads-zero", ["train", *DATA, "--out", "{t}/ck", "--threads", "0"], "--threads"),
    ("train-seed-text", ["train", *DATA, "--out", "{t}/ck", "--seed", "x"], "--seed"),
    ("train-config-missing", ["train", *DATA, "--out", "{t}/ck", "--config", "{t}/missing.toml"], "missing.toml"),
    ("train-config-not-toml", ["train", *DATA, "--out", "{t}/ck", "--config", "{t}/not_toml.toml"],
     "not_toml.toml"),
    ("train-config-bad-lr", ["train", *DATA, "--out", "{t}/ck", "--config", "{t}/bad_lr.toml"], "lr"),
    ("train-config-bad-type", ["train", *DATA, "--out", "{t}/ck", "--config", "{t}/bad_epochs.toml"], "epochs"),
    ("train-config-one-seed-ensemble", ["train", *DATA, "--out", "{t}/ck", "--config", "{t}/one_seed_ensemble.toml"],
     "ensemble_seeds"),
    ("train-config-beyond-without-residual", ["train", *DATA, "--out", "{t}/ck", "--config", "{t}/beyond_log_ms.toml"],
     "scale_beyond_range"),
    ("train-config-beyond-scale-twice", ["train", *DATA, "--out", "{t}/ck", "--config", "{t}/beyond_twice.toml"],
     "beyond_scale = 0.0 and scale_beyond_range"),
    ("train-config-unknown-key", ["train", *DATA, "--out", "{t}/ck", "--config", "{t}/unknown_key.toml"],
     "bogus_key"),
    # --- evaluate
    ("evaluate-no-checkpoint", ["evaluate", *DATA], "--checkpoint"),
    ("evaluate-checkpoint-missing", ["evaluate", "--checkpoint", "{t}/nock", *DATA], "nock"),
    ("evaluate-checkpoint-corrupt", ["evaluate", "--checkpoint", "{t}/corrupt_ck", *DATA], "model.pt"),
    ("evaluate-meta-not-json", ["evaluate", "--checkpoint", "{t}/meta_not_json_ck", *DATA], "meta.json"),
    ("evaluate-meta-no-model", ["evaluate", "--checkpoint", "{t}/meta_no_model_ck", *DATA], "meta.json"),
    ("evaluate-old-features", ["evaluate", "--checkpoint", "{t}/old_features_ck", *DATA], "retrain"),
    ("evaluate-weights-mismatch", ["evaluate", "--checkpoint", "{t}/mismatch_ck", *DATA], "model.pt"),
    ("evaluate-data-missing", ["evaluate", "--checkpoint", "{ck}", "--data", "{t}/nope"], "nope"),
    ("evaluate-data-empty", ["evaluate", "--checkpoint", "{ck}", "--data", "{t}/empty"], "empty"),
    ("evaluate-strict", ["evaluate", "--checkpoint", "{ck}", "--data", "{t}/some_bad", "--strict"],
     "some_bad.jsonl:2"),
    ("evaluate-other-hardware", ["evaluate", "--checkpoint", "{ck}", "--data", "{t}/h100"], "h100"),
    ("evaluate-split", ["evaluate", "--checkpoint", "{ck}", *DATA, "--split", "foo"], "foo"),
    ("evaluate-plot-folder", ["evaluate", "--checkpoint", "{ck}", *DATA, "--plot", "{t}/empty"], "--plot"),
    ("evaluate-plot-suffix", ["evaluate", "--checkpoint", "{ck}", *DATA, "--plot", "{t}/plot.txt"], ".png"),
    ("evaluate-plot-under-file", ["evaluate", "--checkpoint", "{ck}", *DATA, "--plot", "{t}/a_file/p.png"],
     "a_file"),
    ("evaluate-two-data", ["evaluate", "--checkpoint", "{ck}", *DATA, "{t}/good"], "--data"),
    ("protocol-unknown", ["evaluate", "--protocol", "lofi", *DATA], "lofi"),
    ("protocol-with-checkpoint", ["evaluate", "--protocol", "lofo", "--checkpoint", "{ck}", *DATA], "--checkpoint"),
    ("protocol-seeds", ["evaluate", "--protocol", "lofo", *DATA, "--seeds", "0,x"], "--seeds"),
    ("protocol-variants", ["evaluate", "--protocol", "lofo", *DATA, "--variants", "gnn,gnn-prio"], "gnn-prio"),
    ("protocol-epochs", ["evaluate", "--protocol", "size", *DATA, "--epochs", "0"], "--epochs"),
    ("protocol-labels", ["evaluate", "--protocol", "lofo", *DATA, "--labels", "min"], "labels 'min'"),
    ("protocol-data-missing", ["evaluate", "--protocol", "lofo", "--data", "{t}/nope"], "nope"),
    ("protocol-fresh-missing", ["evaluate", "--protocol", "size", *DATA, "--fresh-data", "{t}/nope"], "nope"),
    ("protocol-fresh-not-size", ["evaluate", "--protocol", "lofo", *DATA, "--fresh-data", "{t}/good"],
     "--fresh-data: only with --protocol size"),
    # --- sweep
    ("sweep-no-trials", ["sweep", *DATA], "--trials"),
    ("sweep-trials-zero", ["sweep", *DATA, "--trials", "0"], "--trials"),
    ("sweep-epochs-zero", ["sweep", *DATA, "--trials", "1", "--epochs", "0"], "--epochs"),
    ("sweep-data-missing", ["sweep", "--data", "{t}/nope", "--trials", "1"], "nope"),
    ("sweep-write-best-folder", ["sweep", *DATA, "--trials", "1", "--write-best", "{t}/empty"], "--write-best"),
    ("sweep-config-not-toml", ["sweep", *DATA, "--trials", "1", "--config", "{t}/not_toml.toml"],
     "not_toml.toml"),
    ("sweep-seed-text", ["sweep", *DATA, "--trials", "1", "--seed", "x"], "--seed"),
    # --- predict
    ("predict-no-spec", ["predict"], "spec"),
    ("predict-unknown-hardware", ["predict", *GPT2, "--hardware", "tpu"], "tpu"),
    ("predict-checkpoint-missing", ["predict", *GPT2, "--checkpoint", "{t}/nock"], "nock"),
    ("predict-checkpoint-corrupt", ["predict", *GPT2, "--checkpoint", "{t}/corrupt_ck"], "model.pt"),
    ("predict-precision", [*P, "--precision", "fp8"], "fp8"),
    ("predict-gpus-8-cpu", [*P, "--gpus", "8"], "--gpus 8"),
    ("predict-gpus-zero", [*P, "--gpus", "0"], "--gpus"),
    ("predict-parallel-unknown", [*P, "--gpus", "2", "--parallel", "zero3"], "--parallel 'zero3'"),
    ("predict-parallel-one-gpu", [*P, "--parallel", "fsdp"], "--parallel fsdp"),
    ("predict-parallel-compression", [*P, "--gpus", "2", "--parallel", "fsdp", "--grad-compression", "bf16"],
     "--grad-compression"),
    ("predict-gpus-uneven", [*P, "--gpus", "3", "--nodes", "2"], "--gpus 3"),
    ("predict-gpus-per-node", [*P, "--gpus", "16", "--nodes", "1", "--interconnect", "h100-nvswitch"],
     "--gpus 16"),
    ("predict-interconnect-unknown", [*P, "--gpus", "2", "--interconnect", "nope"], "nope"),
    ("predict-interconnect-not-json", [*P, "--gpus", "2", "--interconnect", "{t}/not_json.json"], "not_json.json"),
    ("predict-bucket-zero", [*P, "--bucket-cap-mb", "0"], "--bucket-cap-mb"),
    ("predict-bucket-nan", [*P, "--bucket-cap-mb", "nan"], "--bucket-cap-mb"),
    ("predict-grad-accum-zero", [*P, "--grad-accum", "0"], "--grad-accum"),
    ("predict-grad-compression", [*P, "--grad-compression", "fp8"], "fp8"),
    ("predict-epochs-no-size", [*P, "--epochs", "3"], "--dataset-size"),
    ("predict-steps-and-epochs", [*P, "--steps", "10", "--epochs", "1", "--dataset-size", "100"], "--steps"),
    ("predict-cost-negative", [*P, "--gpu-hour-cost", "-1"], "--gpu-hour-cost"),
    ("predict-steps-zero", [*P, "--steps", "0"], "--steps"),
    ("predict-dataset-size-zero", [*P, "--dataset-size", "0"], "--dataset-size"),
    ("predict-set-wrong-type", ["predict", "hf:gpt2", "--set", "n_layer=abc", "--hardware", "cpu"], "n_layer=abc"),
    ("predict-batch-huge", ["predict", "hf:gpt2", "--batch-size", "1000000000", "--hardware", "cpu"],
     "1048576"),
    ("predict-optimizer", [*P, "--optimizer", "lion"], "lion"),
    ("predict-py-raises", ["predict", UM + ":raises", "--hardware", "cpu"], f"user_models.py:{line_of('raises')}"),
    ("predict-py-shape-error", ["predict", UM + ":shape_error", "--hardware", "cpu"], "user_models.py"),
    # --- comm
    ("comm-nothing", ["comm"], "--bytes"),
    ("comm-bytes-1e30", ["comm", "--bytes", "1e30", "--gpus", "8"], "1e30"),
    ("comm-bytes-text", ["comm", "--bytes", "abc", "--gpus", "8"], "abc"),
    ("comm-bytes-zero", ["comm", "--bytes", "0", "--gpus", "8"], "--bytes"),
    ("comm-bytes-negative", ["comm", "--bytes", "-5", "--gpus", "8"], "--bytes"),
    ("comm-bytes-inf", ["comm", "--bytes", "inf", "--gpus", "2"], "inf"),
    ("comm-no-gpus", ["comm", "--bytes", "64M"], "--gpus"),
    ("comm-gpus-zero", ["comm", "--bytes", "64M", "--gpus", "0"], "--gpus"),
    ("comm-gpus-uneven", ["comm", "--bytes", "64M", "--gpus", "16", "--nodes", "3"], "--nodes 3"),
    ("comm-gpus-per-node", ["comm", "--bytes", "64M", "--gpus", "16", "--nodes", "1"], "--gpus 16"),
    ("comm-interconnect-unknown", ["comm", "--bytes", "64M", "--gpus", "8", "--interconnect", "nope"], "nope"),
    ("comm-interconnect-not-json", ["comm", "--bytes", "64M", "--gpus", "8", "--interconnect",
                                    "{t}/not_json.json"], "not_json.json"),
    ("comm-interconnect-missing", ["comm", "--bytes", "64M", "--gpus", "8", "--interconnect",
                                   "{t}/missing.json"], "missing.json"),
    ("comm-one-node-profile", ["comm", "--bytes", "64M", "--gpus", "8", "--interconnect", "cpu-gloo"],
     "--gpus 8"),
    # --- calibrate-comm (all refused before any process starts)
    ("calibrate-no-out", ["calibrate-comm"], "--out"),
    ("calibrate-out-folder", ["calibrate-comm", "--out", "{t}/empty"], "--out"),
    ("calibrate-collective-unknown", ["calibrate-comm", "--out", "{t}/new.json", "--collectives", "broadcast"],
     "--collectives broadcast"),
    ("calibrate-out-not-profile", ["calibrate-comm", "--out", "{t}/not_json.json"], "not_json.json"),
    ("calibrate-out-under-file", ["calibrate-comm", "--out", "{t}/a_file/p.json"], "a_file"),
    ("calibrate-procs-one", ["calibrate-comm", "--out", "{t}/p.json", "--procs", "1"], "--procs"),
    ("calibrate-procs-text", ["calibrate-comm", "--out", "{t}/p.json", "--procs", "a,b"], "a,b"),
    ("calibrate-min-bytes-zero", ["calibrate-comm", "--out", "{t}/p.json", "--min-bytes", "0"], "--min-bytes"),
    ("calibrate-max-bytes-huge", ["calibrate-comm", "--out", "{t}/p.json", "--max-bytes", "1e30"], "--max-bytes"),
    ("calibrate-min-time-zero", ["calibrate-comm", "--out", "{t}/p.json", "--min-time-s", "0"], "--min-time-s"),
    ("calibrate-sizes-reversed", ["calibrate-comm", "--out", "{t}/p.json", "--min-bytes", "64M",
                                  "--max-bytes", "1M"], "--max-bytes"),
    ("calibrate-fit-outside", ["calibrate-comm", "--out", "{t}/p.json", "--fit-min-bytes", "1G"],
     "--fit-min-bytes"),
]


def _record_lines(n: int) -> list[str]:
    return CPU_RECORDS.read_text().splitlines()[:n]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> Path:
    t = tmp_path_factory.mktemp("bad")
    (t / "empty").mkdir()
    (t / "a_file").write_text("not a folder\n")
    (t / "model.txt").write_text("not a model\n")
    (t / "plot.txt").write_text("")
    (t / "not_json.json").write_text("{not json\n")
    (t / "list.json").write_text("[1, 2]\n")
    (t / "unknown_type.json").write_text('{"model_type": "gtp2"}\n')
    (t / "bad_field.json").write_text('{"model_type": "gpt2", "n_layer": "abc"}\n')
    (t / "import_error.py").write_text("import torch\nx = 1 / 0\n")
    (t / "syntax_error.py").write_text("def make(:\n")
    (t / "not_toml.toml").write_text("this is = = not toml\n")
    (t / "grid.toml").write_text("")
    (t / "bad_lr.toml").write_text("lr = -1.0\n")
    (t / "bad_epochs.toml").write_text('epochs = "many"\n')
    (t / "unknown_key.toml").write_text("bogus_key = 1\n")
    (t / "one_seed_ensemble.toml").write_text("ensemble_seeds = [3]\n")
    (t / "beyond_log_ms.toml").write_text("scale_beyond_range = true\n")
    (t / "beyond_twice.toml").write_text('beyond_scale = 0.0\nscale_beyond_range = true\n[model]\n'
                                         'target = "log_ratio_prior"\n')
    lines = _record_lines(6)
    for name, body in {
        "good": lines,
        "all_bad": ["not json", '{"key": "x"}', "[1]"],
        "some_bad": [lines[0], "{torn", *lines[1:4]],
        "missing_field": [lines[0], json.dumps({**json.loads(lines[1]), "config": {"spec": "hf:gpt2"}})],
        "wrong_type": [lines[0], json.dumps({**json.loads(lines[1]), "timing": {
            **json.loads(lines[1])["timing"], "step_ms": {"median": "fast"}}})],
        "h100": [json.dumps({**json.loads(line), "env": {**json.loads(line)["env"], "hardware": "h100"}})
                 for line in lines],
    }.items():
        (t / name).mkdir()
        (t / name / f"{name}.jsonl").write_text("\n".join(body) + "\n")
    ck = REPO / "checkpoints" / "cpu"
    meta = json.loads((ck / "meta.json").read_text())
    for name, meta_text, weights in (
            ("corrupt_ck", json.dumps(meta), b"garbage, not a torch file"),
            ("meta_not_json_ck", "{oops", (ck / "model.pt").read_bytes()),
            ("meta_no_model_ck", json.dumps({"hardware": "cpu"}), (ck / "model.pt").read_bytes()),
            ("old_features_ck", json.dumps({**meta, "feature_version": 1}), (ck / "model.pt").read_bytes()),
            ("mismatch_ck", json.dumps(meta), None)):
        (t / name).mkdir()
        (t / name / "meta.json").write_text(meta_text)
        if weights is None:
            import torch

            torch.save({"not_a_layer.weight": torch.zeros(2)}, t / name / "model.pt")
        else:
            (t / name / "model.pt").write_bytes(weights)
    return t


def _argv(argv: list[str], t: Path) -> list[str]:
    return [a.format(t=t, tests=TESTS, ck=REPO / "checkpoints" / "cpu") for a in argv]


def _command(argv: list[str]) -> str:
    words = argv
    if not words or words[0] not in cli.build_parser()._subparsers._group_actions[0].choices:
        return "gnn-ptp"  # no command yet: the top-level parser answers
    if words[0] == "data" and len(words) > 1 and words[1] == "stats":
        return "gnn-ptp data stats"
    return f"gnn-ptp {words[0]}"


def check_one_line(code, out: str, err: str, prefix: str, names: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"exit {code}, stderr: {err}"
    assert "Traceback" not in err + out and "weights_only" not in err
    assert len(lines) == 1, f"{len(lines)} stderr lines: {err}"
    assert lines[0].startswith(f"{prefix}: error: "), lines[0]
    assert names in lines[0], f"{names!r} not named in: {lines[0]}"
    return lines[0]


@pytest.mark.parametrize("argv,names", [pytest.param(a, n, id=i) for i, a, n in CASES])
def test_bad_input(argv, names, bad_files, capsys, monkeypatch):
    monkeypatch.chdir(bad_files)  # a stray relative output lands in the case folder, never in the repo
    monkeypatch.setenv("GNN_PTP_CACHE", str(bad_files / ".cache"))
    argv = _argv(argv, bad_files)
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    check_one_line(code, out, err, _command(argv), names.format(t=bad_files))


def test_enough_cases():
    commands = {_command(a).removeprefix("gnn-ptp").strip() for _, a, _ in CASES}
    assert len(CASES) >= 100
    assert {"graph", "collect", "data stats", "train", "evaluate", "sweep", "predict", "comm",
            "calibrate-comm"} <= commands


def test_corrupt_checkpoint_does_not_advise_unsafe_loading(bad_files, capsys):
    code = cli.main(["predict", *GPT2, "--checkpoint", str(bad_files / "corrupt_ck")])
    err = capsys.readouterr().err
    assert code == 2 and "weights_only" not in err and "damaged" in err


def test_outputs_checked_before_work(bad_files, capsys, monkeypatch):
    """train --out <existing file> refuses before reading the data (the data folder here does not even
    exist: the output is checked first)."""
    import gnn_ptp.train as train_mod

    monkeypatch.setattr(train_mod, "train", lambda *a, **k: pytest.fail("trained before checking --out"))
    code = cli.main(["train", "--data", str(bad_files / "good"), "--out", str(bad_files / "a_file")])
    assert code == 2 and "a_file" in capsys.readouterr().err


# --- a few as real processes: the installed entry point's exit code and stderr, nothing else


@pytest.mark.parametrize("argv,names", [
    (["predict", "hf:gpt2", "--batch-size", "0"], "--batch-size"),
    (["data", "stats", "{t}/nope"], "nope"),
    (["comm", "--bytes", "1e30", "--gpus", "8"], "1e30"),
    (["graph", UM + ":raises"], f"user_models.py:{line_of('raises')}"),
])
def test_bad_input_subprocess(argv, names, bad_files):
    argv = _argv(argv, bad_files)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "gnn_ptp", *argv], capture_output=True, text=True, env=env,
                       cwd=bad_files, timeout=120)
    check_one_line(r.returncode, r.stdout, r.stderr, _command(argv), names)


# --- the newcomer's path: what the issue found answered wrongly


def test_readme_style_py_model_works(capsys, monkeypatch, tmp_path):
    """A factory written from the README (a tensor input, a tensor target, nn.CrossEntropyLoss()) traces,
    and its one input tensor is passed whole, not unpacked along the batch."""
    from gnn_ptp.spec import Shape, build, parse_spec

    w = build(parse_spec(f"py:{TESTS}/user_models.py:classifier"), Shape(4), "meta")
    assert len(w.args) == 1 and tuple(w.args[0].shape) == (4, 32)
    assert list(w.targets) == ["target0"] and tuple(w.targets["target0"].shape) == (4,)
    monkeypatch.setenv("GNN_PTP_CACHE", str(tmp_path))
    assert cli.main(["graph", f"py:{TESTS}/user_models.py:classifier", "--batch-size", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batch_size"] == 4


def test_gpus_checked_before_tracing(capsys, monkeypatch):
    from gnn_ptp import prediction

    monkeypatch.setattr(prediction, "_graphs", lambda *a, **k: pytest.fail("traced before checking --gpus"))
    assert cli.main([*P, "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "--gpus 8" in err and "node" in err and "2 nodes" not in err


def test_range_warnings_name_the_value_given():
    """Graph features are log2(1 + x): a sequence of 512 reads 512 in the warning, not 513."""
    import torch

    from gnn_ptp import graph, prediction

    names = graph.GRAPH_FEATURE_NAMES
    u = torch.zeros(1, len(names))
    u[0, names.index("log_seq_len")] = graph._log(512)
    lo, hi = [0.0] * len(names), [0.0] * len(names)
    lo[names.index("log_seq_len")], hi[names.index("log_seq_len")] = graph._log(16), graph._log(128)
    notes = prediction._ood_warnings(u, {"x_cat": torch.zeros(1, 1, dtype=torch.long)},
                                     {"train_ranges": {"u_min": lo, "u_max": hi, "op_ids": [0]}})
    assert notes == ["seq_len is 512, outside the training range [16, 128]: extrapolating"]


def test_predict_table_columns_never_touch():
    from gnn_ptp.prediction import Prediction, format_predictions

    p = Prediction(spec="hf:gpt2", precision="fp32", batch_size=8, seq_len=1024, image_size=None,
                   optimizer="adamw", gpus=16, hardware="h100", forward_ms=9999.9, backward_ms=145800.0,
                   optimizer_ms=1.0, compute_ms=145800.0, comm_exposed_ms=9181.9, iteration_ms=154981.9,
                   peak_memory_bytes=2e9)
    lines = format_predictions([p]).splitlines()
    header = next(line for line in lines if line.startswith("precision"))
    row = next(line for line in lines if line.startswith("fp32"))
    assert len(row.split()) == len(header.split())  # one token per column ("peak mem" and "2.0 GB": two)


def test_hf_model_folder_with_config_json(tmp_path, capsys):
    """hf:<folder> reads the folder's config.json (as save_pretrained writes it), like hf:<config.json>."""
    import transformers

    transformers.AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=100).save_pretrained(tmp_path)
    outs = []
    for spec in (f"hf:{tmp_path}", f"hf:{tmp_path / 'config.json'}"):
        assert cli.main(["graph", spec, "--batch-size", "2", "--seq-len", "8", "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        outs.append((d["family"], d["params"], d["nodes"]))
    assert outs[0] == outs[1] and outs[0][0] == "gpt2"


def test_hardware_typo_suggests_the_shipped_checkpoint(capsys):
    assert cli.main(["predict", *GPT2, "--hardware", "CPU"]) == 2
    assert "did you mean 'cpu'" in capsys.readouterr().err


def test_fsdp_gloo_bad_interconnect_is_one_line_exit_2():
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "fsdp_gloo.py"
    r = subprocess.run([sys.executable, str(script), "--interconnect", "no-such-profile.json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "fsdp_gloo.py: error: --interconnect no-such-profile.json: no such file"]


def test_fsdp_gloo_bad_day_is_one_line_exit_2():
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "fsdp_gloo.py"
    r = subprocess.run([sys.executable, str(script), "--day", "2026-13-01"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "fsdp_gloo.py: error: --day 2026-13-01: not a date; allowed: YYYY-MM-DD (a UTC day), e.g. 2026-11-28"]


def test_run_script_exits_with_mains_code_and_one_line_on_user_error(capsys):
    """errors.run_script, which every benchmark script's __main__ goes through: main's return value is the exit
    code (None is 0), a UserError is `<prog>: error: <message>` on one line and exit 2, anything else is raised."""
    from gnn_ptp.errors import UserError, run_script

    for returned, code in ((None, 0), (0, 0), (3, 3)):
        with pytest.raises(SystemExit) as e:
            run_script(lambda: returned, prog="bench.py")
        assert (e.value.code or 0) == code  # sys.exit(None) exits 0
    capsys.readouterr()

    def bad():
        raise UserError("--data nowhere:\n  no such folder")

    with pytest.raises(SystemExit) as e:
        run_script(bad, prog="bench.py")
    assert e.value.code == 2
    assert capsys.readouterr().err == "bench.py: error: --data nowhere: no such folder\n"

    def broken():
        raise ValueError("a bug, not bad input")

    with pytest.raises(ValueError):
        run_script(broken, prog="bench.py")


def test_help_and_argument_refusals_import_no_torch():
    """Building the parser, ``--help`` and a refusal at argument parsing answer without importing torch (a
    second, not three: the collector's settings live in ``gnn_ptp.collect_config``, apart from the collector)."""
    code = ("import sys\nfrom gnn_ptp import cli\n"
            "try:\n    cli.main(['predict', 'hf:gpt2', '--batch-size', '0'])\n"
            "except SystemExit as e:\n    assert e.code == 2, e.code\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_geometric', 'transformers'))\n"
            "assert not heavy, heavy[:5]\n")
    done = run_fresh(code, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--batch-size: '0' is out of range" in done.stderr



def test_prior_error_sources_unknown_lofo_family_is_one_line_exit_2():
    """benchmarks/prior_error_sources.py --lofo-fold names a family the folder's records do not have (the CPU
    dataset's): one line with the families it has, exit 2, before any graph is traced."""
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "prior_error_sources.py"), "--data",
                        str(root / "datasets" / "cpu"), "--lofo-fold", "efficientnet-b7"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if "Warning" not in line and "warnings.warn" not in line]
    assert len(lines) == 1 and lines[0].startswith(
        f"prior_error_sources.py: error: --lofo-fold efficientnet-b7: not a family of {root / 'datasets' / 'cpu'}; "
        "allowed: bert, convnext, densenet, efficientnet, gpt2,"), r.stderr


def test_size_prior_without_profiles_is_one_line_exit_2():
    """benchmarks/size_prior.py --data names a folder of records without per-op profiles (a size set measured
    with --profile none): no prior to refit, one line naming it and what to give, exit 2, before any graph is
    traced; an --apart folder that does not exist is one line too, before --data is read."""
    root = Path(__file__).resolve().parent.parent
    folder = root / "datasets" / "cpu" / "cpu-size-fifth-2026-12-07"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "size_prior.py"), "--data", str(folder)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if "Warning" not in line and "warnings.warn" not in line]
    assert lines == [f"size_prior.py: error: --data {folder}: no per-op profiles, no prior to refit; give a folder "
                     "measured with --profile (datasets/cpu, datasets/cpu-<kind>)"], r.stderr
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "size_prior.py"), "--apart", "no-such-set"],
                       capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stderr.strip().splitlines() if "Warning" not in line and "warnings.warn" not in line]
    assert r.returncode == 2 and lines == ["size_prior.py: error: --apart no-such-set: no such folder; give a folder "
                                           "of records measured apart (datasets/cpu/cpu-size-*)"], r.stderr


def test_fresh_sessions_bad_folder_is_one_line_exit_2(tmp_path):
    """benchmarks/fresh_sessions.py --data names no folder, or a folder without records: one line naming it and
    what to give, exit 2; on the seventh size set's records it prints VGG's optimizer time per parameter."""
    root = Path(__file__).resolve().parent.parent
    script = str(root / "benchmarks" / "fresh_sessions.py")
    for data, why in ((tmp_path / "nope", "not a folder"), (tmp_path, "no ok records in any .jsonl under it")):
        r = subprocess.run([sys.executable, script, "--data", str(data)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"fresh_sessions.py: error: --data {data}: {why}; give a CPU dataset folder such as datasets/cpu"], r.stderr
    folder = root / "datasets" / "cpu" / "cpu-size-seventh-2026-12-07"
    r = subprocess.run([sys.executable, script, "--data", str(folder)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.strip().startswith("vgg")]
    assert sorted(row[3] for row in rows) == ["amp-bf16", "bf16", "fp32"], r.stdout
    assert all(2.0 < float(row[4]) < 30.0 for row in rows), r.stdout  # ns per parameter, measured


def test_size_fold_convolutions_without_profiles_is_one_line_exit_2():
    """benchmarks/size_fold_convolutions.py without --apart, or with a folder measured with --profile none: one
    line naming what to give, exit 2, before any graph is traced or prior refitted."""
    root = Path(__file__).resolve().parent.parent
    script = str(root / "benchmarks" / "size_fold_convolutions.py")
    folder = root / "datasets" / "cpu" / "cpu-size-seventh-2026-12-07"
    for args, line in (([], "--apart: give at least one profiled folder measured apart "
                                "(datasets/cpu/cpu-size-fresh-profiles-2026-12-06)"),
                       (["--apart", str(folder)], f"--apart {folder}: no profiles/ folder in it; give a folder measured "
                                                  "with --profile (datasets/cpu/cpu-size-*-profiles-*)")):
        r = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"size_fold_convolutions.py: error: {line}"], r.stderr
