"""The README's commands and its Python example, run as printed.

Every line of every ```bash block, every ``$ gnn-ptp ...`` / ``$ python ...`` example and every
```python block is read from README.md and must be named below, in exactly one of:

- ``RUN``: run here, in-process through ``gnn_ptp.cli.main`` from the repository root, and checked;
- ``NOT_IN_CI``: cannot run in CI by nature (installs packages, needs a GPU or a cluster, trains or
  measures for minutes); each says why and is still checked as far as it can be (its arguments parse,
  the extras it installs hold what the next command needs);
- ``PYTHON_BLOCKS``: the ```python examples, run and checked.

A README line that is in none of them fails ``test_every_readme_command_is_named``: nothing is skipped
silently.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gnn_ptp import cli

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"

FIRST = "gnn-ptp predict hf:gpt2 --batch-size 8 --seq-len 1024 --precision all"
CPU_EXAMPLE = ("gnn-ptp predict hf:gpt2 --set n_layer=2 --set n_embd=128 --set n_head=4 --set vocab_size=2000 "
               "--batch-size 8 --seq-len 128 --precision all --hardware cpu")
ANALYTIC = "ANALYTIC ESTIMATE: no h100 checkpoint yet"
LLAMA_GRAPH = "gnn-ptp graph hf:llama --precision amp-bf16 --batch-size 4 --seq-len 2048"

RUN = {
    # command: texts its stdout must hold (an example printed with "$ ..." is compared with its output)
    FIRST: ["hf:gpt2 on 1x h100", ANALYTIC, "fp32", "tf32", "torch-default", "amp-fp16", "amp-bf16", "bf16",
            "<- fastest"],
    CPU_EXAMPLE: ["hf:gpt2 on 1x cpu", "fp32", "amp-bf16", "bf16", "<- fastest",
                  "left out: tf32, torch-default, amp-fp16"],
    CPU_EXAMPLE + " --explain": ["top 8 ops by predicted share in any class", "per-op times from the per-node head of",
                                 "fp32", "amp-bf16", "bf16"],
    "gnn-ptp predict hf:gpt2 --batch-size 8 --seq-len 1024 --precision bf16 --explain": [
        ANALYTIC, "per-op times from the calibrated physical prior (ANALYTIC ESTIMATE", "top 8 ops by predicted time (bf16"],
    "gnn-ptp predict hf:llama --batch-size 4 --seq-len 2048 --precision all": ["hf:llama on 1x h100", ANALYTIC],
    "gnn-ptp predict hf:llama --batch-size 4 --seq-len 2048 --precision all --gpus 8 --epochs 3 "
    "--dataset-size 1000000 --gpu-hour-cost 2.5": ["hf:llama on 8x h100", ANALYTIC, "h100-nvswitch"],
    "gnn-ptp predict hf:gpt2 --precision amp-bf16 --batch-size 8 --seq-len 1024 --gpus 16": [
        "hf:gpt2 on 16x h100 on 2 node(s)", ANALYTIC],
    "gnn-ptp predict hf:gpt2 --precision amp-bf16 --batch-size 8 --seq-len 1024 --gpus 8 --grad-accum 4 "
    "--bucket-cap-mb 50 --grad-compression bf16 --epochs 3 --dataset-size 1000000": ["hf:gpt2 on 8x h100", ANALYTIC],
    LLAMA_GRAPH: ["family llama", "tensor cores:"],
    "gnn-ptp data stats datasets/cpu": ["records:", "precision", "noise"],
    "gnn-ptp comm --bytes 256M --gpus 16 --nodes 2": ["all-reduce of 256 MiB over 16 ranks on 2 node(s)"],
    "gnn-ptp comm --bytes 256M --gpus 8": ["all-reduce of 256 MiB over 8 ranks on 1 node(s), h100-nvswitch"],
    "gnn-ptp comm --list": ["h100-nvswitch", "h100-ib-ndr400", "cpu-gloo"],
    "gnn-ptp predict hf:llama --seq-len 2048 --precision all --max-batch-size": [
        "the largest batch whose training step fits in one h100", "bf16", "batch 1 does not fit"],
    "gnn-ptp predict hf:llama --batch-size 1 --seq-len 2048 --gpus 8 --parallel auto": [
        "hf:llama on 8x h100", "--parallel auto, amp-bf16: fsdp-no-reshard", "ddp", "does not fit", "per GPU"],
    "gnn-ptp predict hf:llama --batch-size 1 --seq-len 2048 --gpus 8 --parallel fsdp --precision bf16 --json": [
        '"parallel": "fsdp"', '"memory_per_gpu_bytes"'],
    "gnn-ptp graph hf:gtp2": [],  # an error example: its printed line is compared with stderr
    "gnn-ptp evaluate --protocol hardware --data datasets/cpu": [],  # an error example, as above
    # the shipped checkpoint still gives the README's held-out figures: the table is compared line for line
    # (an exact recompute of its predictions on its stored split; traces the 33 held-out configurations on a
    # cold cache, ~1-2 minutes on 2 cores)
    "gnn-ptp evaluate --checkpoint checkpoints/cpu --data datasets/cpu": [
        "gnn (precision-aware)         6.7%", "ridge on graph totals        20.1%"],
    # the same for the H200 checkpoint (162 held-out configurations traced on a cold cache, ~2-4 minutes)
    "gnn-ptp evaluate --checkpoint checkpoints/h200 --data datasets/h200": [
        "gnn (precision-aware)        14.5%", "gnn, precision-unaware       27.3%"],
    "python -m gnn_ptp.comm": [],  # printed with its output: compared line for line
}

ERROR_EXAMPLES = {"gnn-ptp graph hf:gtp2", "gnn-ptp evaluate --protocol hardware --data datasets/cpu"}
"""Printed with the one error line they give (stderr, exit code 2)."""

NOT_IN_CI = {
    # command: (why it cannot run in CI, how it is checked instead)
    "python3 -m venv .venv": ("creates the environment CI itself runs in (.ci/run does the same)", "none"),
    ". .venv/bin/activate": ("activates that environment", "none"),
    "pip install -e '.[vision,test]'": ("installs packages from the network; .ci/run installs the same "
                                        "extras", "extras"),
    "python -m pytest -q": ("is this test suite", "pytest"),
    "gnn-ptp collect --grid training/grids/cpu.toml --out PASS/cpu --threads 1 --profile all --budget-s 600":
        ("measures the CPU grid for ~10 minutes (one pass); test_node_labels.py harvests a tiny grid with "
         "profiles", "parse"),
    "gnn-ptp data match datasets/cpu": ("traces the 399 configurations of the CPU dataset (minutes); "
                                        "test_match.py matches a tiny real harvest", "parse"),
    "gnn-ptp train --data datasets/cpu --config training/cpu_nodes.toml --out nodes-ckpt --epochs 60 --threads 1":
        ("trains for ~8 minutes; test_node_labels.py trains a small checkpoint with node labels", "parse"),
    "gnn-ptp evaluate --checkpoint nodes-ckpt --data datasets/cpu --json":
        ("needs the checkpoint the line above trains; test_node_labels.py evaluates a small one", "parse"),
    "gnn-ptp collect --grid training/grids/h100.toml --out datasets/h100": ("measures on an H100", "parse"),
    "gnn-ptp train --data datasets/cpu --config training/cpu_nodes_prior.toml --out checkpoints/cpu --baselines":
        ("trains for ~10 minutes on 2 cores and would replace the shipped checkpoint; test_train.py trains "
         "small ones", "parse"),
    "gnn-ptp evaluate --checkpoint checkpoints/cpu --data datasets/cpu --plot parity.png":
        ("writes parity.png into the repository; the same evaluation without --plot runs (RUN)", "parse"),
    "gnn-ptp evaluate --protocol lofo --data datasets/cpu --config training/protocol_cpu.toml":
        ("trains 34 models (35-60 minutes on one core); test_protocol.py runs every protocol on synthetic data "
         "in seconds", "parse"),
    "gnn-ptp evaluate --protocol size --data datasets/cpu --config training/protocol_cpu.toml --seeds 0,1":
        ("trains 4 models (minutes); test_protocol.py runs it on synthetic data", "parse"),
    "gnn-ptp evaluate --protocol lofo --data datasets/h200 --config training/protocol_h200.toml --variants gnn-prior "
    "--seeds 0,1 --jobs 2 --threads 1":
        ("trains 34 models and refits the prior 34 times (52 minutes on two cores); test_protocol.py and "
         "test_prior_fit.py run the protocol, parallel folds and the per-fold refit on synthetic data", "parse"),
    "gnn-ptp evaluate --protocol size --data datasets/h200 --config training/protocol_h200.toml --variants gnn-prior "
    "--seeds 0,1,2 --jobs 2 --threads 1":
        ("trains 3 models over 3 prior refits (2.5 minutes on two cores); test_protocol.py runs it on synthetic "
         "data", "parse"),
    "gnn-ptp sweep --data datasets/cpu --trials 40 --write-best training/best.toml":
        ("40 training runs (hours); test_sweep.py runs small studies", "parse"),
    "gnn-ptp calibrate-comm --out mycluster.json --procs 2,4":
        ("starts gloo worlds and times all-reduces for a minute; test_comm.py calibrates a small range",
         "parse"),
    "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m gnn_ptp "
    "calibrate-comm --out mycluster.json": ("needs two nodes of GPUs", "parse"),
    "gnn-ptp predict hf:gpt2 --precision amp-bf16 --batch-size 8 --seq-len 1024 --gpus 16 --interconnect "
    "mycluster.json": ("needs mycluster.json measured on a cluster (the torchrun line above)", "parse"),
    "F=<files_at of the reply>": ("the lent-device recipe: the folder a device reply's files land in", "none"),
    "cp $F/h100/h100.jsonl datasets/h100/h100.jsonl": ("the lent-device recipe (copies what a slice measured)",
                                                       "none"),
    "mkdir -p datasets/h100/profiles": ("the lent-device recipe", "none"),
    "cp $F/h100/profiles/*.jsonl.gz datasets/h100/profiles/ 2>/dev/null": ("the lent-device recipe", "none"),
    "git add datasets/h100": ("the lent-device recipe: commits a slice", "none"),
    'git commit -m "H100 harvest: slice N"': ("the lent-device recipe: commits a slice", "none"),
    "python benchmarks/gpu_agreement.py --device cpu --small": ("benchmark: runs real steps (minutes)", "none"),
    "python benchmarks/trace.py": ("benchmark: timings in fresh processes (minutes)", "none"),
    "python benchmarks/ddp_gloo.py": ("benchmark: predicts 52 DDP records (minutes)", "none"),
    "gnn-ptp evaluate --protocol hardware --data datasets/cpu datasets/cpu-amd-epyc-family-26-model-2 "
    "datasets/cpu-intel-r-xeon-r-processor-family-6-model-167 --config training/protocol_cpu.toml --seeds 0,1 "
    "--variants gnn-prior --jobs 2 --threads 1 --json": ("trains 18 GNNs on 399-798 configurations each (an "
                                                         "hour); tests/test_protocol.py runs the protocol on "
                                                         "synthetic kinds", "parse"),
    "python benchmarks/transfer_prior.py --data datasets/cpu datasets/cpu-amd-epyc-family-26-model-2 "
    "datasets/cpu-intel-r-xeon-r-processor-family-6-model-167": (
        "benchmark: traces 399 configurations on a fresh clone (minutes); test_descriptor.py runs the split "
        "transfer on synthetic kinds and the script's refusals", "none"),
    "gnn-ptp evaluate --protocol hardware --data datasets/cpu datasets/cpu-amd-epyc-family-26-model-2 "
    "datasets/cpu-intel-r-xeon-r-processor-family-6-model-167 --config training/protocol_cpu.toml --seeds 0,1 "
    "--variants gnn-prior --jobs 2 --threads 1 --hardware-folds pairs --transfer-mode split --json": (
        "trains 12 GNNs on 399 configurations each (15 minutes on two cores); test_prior_fit.py runs the "
        "split transfer in a protocol fold", "parse"),
    "python benchmarks/fsdp_gloo.py": ("benchmark: the FSDP schedule against 52 gloo FSDP2 records", "none"),
    "python benchmarks/fsdp_gloo.py --data datasets/cpu-amd-epyc-family-26-model-2 --interconnect "
    "gnn_ptp/interconnects/cpu-gloo-amd-epyc-family-26-model-2.json": (
        "benchmark: the same on the second CPU kind's 52 configurations, with its own profile", "none"),
    "python benchmarks/fsdp_gloo.py --data datasets/cpu-intel-r-xeon-r-processor-family-6-model-167 --interconnect "
    "gnn_ptp/interconnects/cpu-gloo-intel-r-xeon-r-processor-family-6-model-167.json": (
        "benchmark: the same on the third CPU kind's 52 configurations, with its own profile", "none"),
    "gnn-ptp calibrate-comm --out gnn_ptp/interconnects/cpu-gloo.json --procs 2,4 --collectives "
    "all_gather,reduce_scatter --fsdp": ("measures gloo collectives and FSDP2 steps for a minute and rewrites "
                                         "the shipped profile; test_fsdp.py calibrates a small range", "parse"),
    "python benchmarks/harvest.py --limit 60 --rounds 2": ("benchmark: measures 240 records (~15 minutes)", "none"),
}

PYTHON_BLOCKS = ["python-api-block-1"]  # the Python API example: run, its rows checked


# --- reading the README -------------------------------------------------------------------------------


def _blocks() -> list[tuple[str, list[str]]]:
    blocks, lang, lines = [], None, []
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, lines = line[3:].strip(), []
            else:
                blocks.append((lang, lines))
                lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#\s.*$", "", line).strip()


def _segments(line: str) -> list[str]:
    """A shell line's commands: split at && and ; (none of the README's commands quote them)."""
    return [s.strip() for s in re.split(r"&&|;", _strip_comment(line)) if s.strip()]


def bash_commands() -> list[str]:
    return [seg for lang, lines in _blocks() if lang == "bash" for line in lines
            if line.strip() and not line.lstrip().startswith("#") for seg in _segments(line)]


def dollar_examples() -> dict[str, list[str]]:
    """``$ command`` lines in plain blocks, with the output printed under each."""
    out: dict[str, list[str]] = {}
    for lang, lines in _blocks():
        if lang:
            continue
        current = None
        for line in lines:
            if line.startswith("$ "):
                current = _strip_comment(line[2:])
                out[current] = []
            elif current is not None:
                out[current].append(line)
    return out


def python_blocks() -> dict[str, str]:
    return {f"python-api-block-{i}": "\n".join(lines)
            for i, (lang, lines) in enumerate((b for b in _blocks() if b[0] == "python"), 1)}


def all_commands() -> list[str]:
    return bash_commands() + list(dollar_examples()) + list(python_blocks())


# --- the checks ---------------------------------------------------------------------------------------


def test_every_readme_command_is_named():
    found = set(all_commands())
    named = [*RUN, *NOT_IN_CI, *PYTHON_BLOCKS]
    assert len(named) == len(set(named)), "a command is named twice"
    assert found - set(named) == set(), "README commands no test runs or names: update tests/test_readme.py"
    assert set(named) - found == set(), "named here but no longer in the README"


def test_first_command_installs_what_the_second_needs():
    import tomllib

    first = next(line for lang, lines in _blocks() if lang == "bash" for line in lines)
    assert _segments(first)[-1] == FIRST
    extras = re.search(r"pip install -e '\.\[([a-z,]+)\]'", first).group(1).split(",")
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    installed = " ".join(dep for e in extras for dep in optional[e])
    assert "pytest" in installed  # the second command is `python -m pytest -q`
    addopts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    if "-n" in addopts.split():  # one worker per core needs pytest-xdist, or pytest refuses the option
        assert "pytest-xdist" in installed


@pytest.fixture
def in_repo(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("GNN_PTP_CACHE", str(tmp_path / "cache"))  # cold, as on a fresh machine


IN_A_PROCESS_OF_THEIR_OWN = ("gnn-ptp evaluate --checkpoint ",)
"""Commands that trace many graphs on a cold cache (the shipped checkpoints' held-out configurations) run as
the user runs them, in a fresh process: there ``dataset._map`` forks a worker per core, where in this test
session, which has run autograd on traced CUDA steps, a forked child cannot and every graph is traced here on
one core (the H200 evaluation traces 162 + 27 graphs cold: about 7 minutes of CPU, 616 s of a cold test run
on one core, 565 s as its own process on two cores that three other jobs shared)."""


def _run(command: str, capsys) -> tuple[int, str, str]:
    argv = shlex.split(command)
    if command.startswith(IN_A_PROCESS_OF_THEIR_OWN):
        import subprocess
        import sys

        done = subprocess.run([sys.executable, "-m", "gnn_ptp", *argv[1:]], capture_output=True, text=True)
        return done.returncode, done.stdout, done.stderr
    if argv[:3] == ["python", "-m", "gnn_ptp.comm"]:
        import runpy

        runpy.run_module("gnn_ptp.comm", run_name="__main__")
        code = 0
    else:
        assert argv[0] == "gnn-ptp"
        try:
            code = cli.main(argv[1:])
        except SystemExit as e:
            code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.filterwarnings("ignore:'gnn_ptp.comm' found in sys.modules")  # runpy of an imported module
@pytest.mark.parametrize("command", list(RUN))
def test_readme_command_runs(command, in_repo, capsys):
    code, out, err = _run(command, capsys)
    printed = dollar_examples().get(command)
    if command in ERROR_EXAMPLES:  # the README's examples of a one-line error
        assert code == 2 and err.strip() == "\n".join(printed).strip()
        return
    assert code == 0, err
    for text in RUN[command]:
        assert text in out, (text, out)
    if printed is not None:  # printed with its output: the same lines (timings aside)
        strip = lambda s: re.sub(r"\s+\(traced in [\d.]+ s\)", "", s).rstrip()  # noqa: E731
        assert [strip(line) for line in out.strip().splitlines()] == [strip(line) for line in printed]


@pytest.mark.parametrize("command", list(NOT_IN_CI))
def test_readme_command_not_in_ci_is_checked(command):
    reason, check = NOT_IN_CI[command]
    assert reason
    if check == "parse":
        argv = shlex.split(command)
        argv = argv[argv.index("gnn_ptp") + 1:] if "gnn_ptp" in argv else argv[1:]
        args = cli.build_parser().parse_args(argv)
        assert callable(args.run)
    elif check == "extras":
        test_first_command_installs_what_the_second_needs()
    elif check == "pytest":
        import importlib.util

        assert importlib.util.find_spec("pytest") is not None
    else:
        assert check == "none"


@pytest.mark.parametrize("block", PYTHON_BLOCKS)
def test_readme_python_example_runs(block, in_repo):
    """The Python API example, run as printed: an analytic H100 prediction while no checkpoint exists."""
    scope: dict = {}
    exec(compile(python_blocks()[block], "README.md", "exec"), scope)
    p, rows = scope["p"], scope["rows"]
    assert p.source == "analytic-prior" and p.iteration_ms >= p.compute_ms > 0
    assert [r.precision for r in rows] == ["fp32", "tf32", "torch-default", "amp-fp16", "amp-bf16", "bf16"]


@pytest.mark.parametrize("hardware", ["cpu", "h200"])
def test_the_readme_s_held_out_figure_is_the_shipped_checkpoint_s_on_the_data_it_was_trained_on(hardware):
    """The README's evaluation table is the shipped checkpoint's stored test MAPE, on the data it was
    trained on (the data hash in its meta.json): new records in datasets/<hardware> mean retraining and
    re-measuring the README's figures (`gnn-ptp train ...` then `gnn-ptp evaluate ...`)."""
    import json

    from gnn_ptp import dataset

    meta = json.loads((REPO / "checkpoints" / hardware / "meta.json").read_text())
    printed = dollar_examples()[f"gnn-ptp evaluate --checkpoint checkpoints/{hardware} --data datasets/{hardware}"]
    row = next(line for line in printed if line.startswith("gnn (precision-aware)"))
    assert row.split()[2] == f"{meta['metrics']['test']['overall']['mape']:.1f}%"
    assert int(row.split()[-1]) == meta["metrics"]["test"]["overall"]["n"]
    from gnn_ptp import checkpoint

    model, _ = checkpoint.load(REPO / "checkpoints" / hardware)
    # a checkpoint over the physical prior: the calibration it was trained over is the shipped one
    assert meta.get("prior_calibration", {}) == checkpoint.prior_calibration(model)
    assert bool(meta.get("prior_calibration")) == (meta["model"]["target"] == "log_ratio_prior")
    labels = checkpoint.trained_labels(meta)  # the labels it was trained on (its config's)
    current = dataset.data_hash(dataset.measured_configs(REPO / "datasets" / hardware, label=labels))
    assert current == meta["data_hash"], (f"datasets/{hardware} changed since checkpoints/{hardware} was trained: "
                                          "retrain, re-evaluate")
