"""Kernel-level labels (gnn_ptp/node_labels.py), the node loss, ``evaluate``'s per-op figures and
``predict --explain``.

The profiles are real: a harvest of tiny models on this CPU, run once for the module (a few seconds).
The node-loss test runs on SYNTHETIC graphs and labels (synthetic_data.py: made-up graphs, made-up
times), named as such."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gnn_ptp import cli, dataset, match, node_labels, profiles, records
from gnn_ptp.collect import CollectConfig, collect
from gnn_ptp.trace import trace_step

REPO = __import__("pathlib").Path(__file__).resolve().parent.parent

GRID = """
name = "nl"
precisions = ["fp32", "bf16"]
[[model]]
spec = "random:mlp:3"
set = { in_features = 16, width = 32, depth = 2, num_classes = 4, dropout = 0.0, norm = "layernorm" }
batch_size = [4, 8]
[[model]]
spec = "hf:gpt2"
set = { n_layer = 1, n_embd = 32, n_head = 2, vocab_size = 100 }
batch_size = [2, 4]
seq_len = [8]
[[model]]
spec = "hf:llama"
set = { num_hidden_layers = 1, hidden_size = 32, intermediate_size = 64, num_attention_heads = 2, num_key_value_heads = 1, head_dim = 16, vocab_size = 100 }
batch_size = [2, 4]
seq_len = [8]
"""
TRAIN = """epochs = 4
threads = 1
seed = 0
test_families = ["llama"]
val_families = ["gpt2"]
node_weight = 1.0
[model]
hidden = 16
depth = 1
"""


@pytest.fixture(scope="module")
def harvested(tmp_path_factory):
    """A real harvest of 12 tiny configurations with a profile for every record; then one bf16 record
    of the MLP measured again without a profile (a configuration with profiled and unprofiled records)."""
    threads = torch.get_num_threads()
    folder = tmp_path_factory.mktemp("node-labels") / "cpu"
    grid = folder.parent / "nl.toml"
    grid.write_text(GRID)
    base = dict(device="cpu", threads=1, mode="harvest", warmup_steps=1, harvest_steps=2, harvest_min_steps=2)
    collect(CollectConfig(str(grid), str(folder), profile="all", **base))
    torch.set_num_threads(threads)
    return folder


@pytest.fixture(scope="module")
def labelled(harvested):
    measured = dataset.measured_configs(harvested)
    graphs = dataset.load_graphs(harvested, measured, log=lambda m: None)
    samples = dataset.make_samples(measured, graphs)
    labels = node_labels.load(harvested, measured, log=lambda m: None)
    return measured, samples, labels


def test_labels_are_the_matched_profile_shares_of_the_measured_phases(harvested, labelled):
    measured, samples, labels = labelled
    assert len(measured) == 12 and set(labels) == {m.key for m in measured}
    assert node_labels.attach(samples, labels) == 12
    found = profiles.read_profiles(harvested)
    by_key = {r["key"]: r for r in records.iter_records(harvested) if r["status"] == "ok"}
    for s in samples:
        assert s.y_node.shape == s.node_mask.shape == s.node_share.shape == (s.num_nodes,)
        assert s.node_mask.dtype == torch.bool and s.node_mask.all()  # these small models match fully
        # the label is the node's share of its phase's profiled op time, on the measured phase's scale
        traced = trace_step(dataset.step_config_of(by_key[s.key]["config"], "cpu"))
        m = match.match_profile(traced, found[by_key[s.key]["id"]])
        node_ms = torch.tensor(m.node_ms, dtype=torch.float64)
        phase_total = torch.tensor([m.total_ms[p] for p in ("forward", "backward", "optimizer")])
        share = node_ms / phase_total[s.phase]
        assert torch.allclose(s.node_share.double(), share, rtol=1e-5, atol=1e-9)
        expected = torch.log(share.clamp_min(1e-12)) + s.y[0, s.phase].double()
        assert torch.allclose(s.y_node.double(), expected, atol=1e-4)
        # per phase, the labelled nodes add up to the matched share of the measured phase time, never more
        for p in range(3):
            in_phase = (s.phase == p) & s.node_mask
            if in_phase.any():
                total = float(s.y_node[in_phase].double().exp().sum())
                assert total <= math.exp(float(s.y[0, p])) * 1.001
        assert 0 < float(s.matched_share) <= 1.0001


def test_load_graphs_hands_its_trace_to_node_labels_and_nothing_is_traced_twice(harvested, labelled, tmp_path,
                                                                               monkeypatch):
    """A cold folder: ``load_graphs`` traces every configuration once and keeps the kernel nodes of the
    profiled ones for ``node_labels.load``, which then only matches profiles; the labels are the same as
    from its own trace."""
    import shutil

    folder = tmp_path / "cpu"
    shutil.copytree(harvested, folder, ignore=shutil.ignore_patterns(".cache"))
    monkeypatch.setenv("GNN_PTP_CACHE", str(tmp_path / "cold"))  # no graph from predict's shared cache either
    measured = dataset.measured_configs(folder)
    dataset.load_graphs(folder, measured, log=lambda m: None)
    said = []
    labels = node_labels.load(folder, measured, log=said.append)
    assert said[0].startswith("node labels: tracing 0 configurations, matching 12 profiles"), said
    expected = labelled[2]
    assert set(labels) == set(expected)
    for key, lab in labels.items():
        assert torch.equal(lab["mask"], expected[key]["mask"]) and torch.allclose(lab["share"], expected[key]["share"])


def test_a_new_match_version_rematches_profiles_and_keeps_the_traced_kernels(harvested, labelled, tmp_path,
                                                                             monkeypatch):
    """The cache made under another ``MATCH_VERSION`` (here: one that is about to be bumped) keeps its
    traced kernels: the next ``load`` traces nothing, matches every profile again, and gives the same
    labels as the matcher it now runs."""
    import shutil

    from gnn_ptp import match

    folder = tmp_path / "cpu"
    shutil.copytree(harvested, folder)  # with its warm cache
    measured = dataset.measured_configs(folder)
    node_labels.load(folder, measured, log=lambda m: None)
    monkeypatch.setattr(match, "MATCH_VERSION", match.MATCH_VERSION + 1)
    said = []
    labels = node_labels.load(folder, measured, log=said.append)
    assert said[0].startswith("node labels: tracing 0 configurations, matching 12 profiles"), said
    for key, lab in labels.items():
        assert torch.allclose(lab["share"], labelled[2][key]["share"])
    said.clear()
    node_labels.load(folder, measured, log=said.append)
    assert not said  # the re-matched profiles were kept under the new version


def test_mask_semantics(labelled):
    measured, samples, labels = labelled
    first, second = samples[0], samples[1]
    # a configuration without a profile, and a label of another node count, give an all-false mask
    held = {second.key: {**labels[first.key]}} if first.num_nodes != second.num_nodes else {}
    assert node_labels.attach([first, second], held) == 0
    for s in (first, second):
        assert not s.node_mask.any() and math.isnan(float(s.matched_share)) and (s.y_node == 0).all()
    assert node_labels.node_loss(torch.zeros(first.num_nodes), first, 0.1) is None
    # a node matched in no profile is masked out, and a zero share never becomes a label
    lab = labels[first.key]
    lab = {**lab, "mask": lab["mask"].clone(), "share": lab["share"].clone()}
    lab["mask"][0] = False
    lab["share"][1] = 0.0
    node_labels.attach([first], {first.key: lab})
    assert not first.node_mask[0] and not first.node_mask[1] and first.node_mask[2:].all()
    assert torch.isfinite(first.y_node).all()


def test_records_without_profiles_have_no_labels(harvested, tmp_path):
    """A folder whose records carry no profile (the classic loop's): every mask false, nothing traced."""
    folder = tmp_path / "cpu"
    folder.mkdir()
    for r in records.iter_records(harvested):
        r.pop("profile", None)
        r.pop("_file", None)
        records.append_record(r, folder, "nl.jsonl")
    measured = dataset.measured_configs(folder)
    assert node_labels.load(folder, measured, log=lambda m: None) == {}


def test_node_loss_is_finite_and_decreases_on_synthetic_graphs():
    """SYNTHETIC graphs and labels (made up, no measurement): the share-weighted node loss trains."""
    from torch_geometric.data import Batch, Data

    from gnn_ptp.model import ModelConfig, StepTimeGNN
    from synthetic_data import synthetic_graph

    torch.manual_seed(0)
    samples = []
    for i in range(6):
        g = synthetic_graph(f"{i + 1:04x}")
        d = Data(**g)
        d.num_nodes = g["x"].shape[0]
        node_ms = torch.exp(g["x"][:, 0])  # made-up per-node times
        phase_ms = torch.zeros(3).index_add(0, g["phase"], node_ms)
        d.y = torch.log(torch.cat([phase_ms, phase_ms.sum()[None]]))[None]
        d.node_share = node_ms / phase_ms[g["phase"]]
        d.node_mask = torch.rand(d.num_nodes) > 0.2  # some nodes unmatched
        d.y_node = torch.where(d.node_mask, torch.log(node_ms), torch.zeros(d.num_nodes))
        samples.append(d)
    batch = Batch.from_data_list(samples)
    model = StepTimeGNN(ModelConfig(hidden=16, depth=1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = node_labels.node_loss(model(batch)["log_node_ms"], batch, delta=0.1)
        assert loss is not None and torch.isfinite(loss)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    # the weights are the shares: a node of zero share does not count
    d = samples[0]
    zero = d.node_share.clone()
    zero[d.node_mask] = 0.0
    zero[torch.nonzero(d.node_mask)[0]] = 1.0
    only = d.clone()
    only.node_share = zero
    one = int(torch.nonzero(d.node_mask)[0])
    pred = torch.zeros(d.num_nodes)
    expected = torch.nn.functional.huber_loss(pred[one], d.y_node[one], delta=0.1)
    assert torch.allclose(node_labels.node_loss(pred, Batch.from_data_list([only]), 0.1), expected)


@pytest.fixture(scope="module")
def checkpoint(harvested, tmp_path_factory):
    root = tmp_path_factory.mktemp("node-ckpt")
    (root / "t.toml").write_text(TRAIN)
    assert cli.main(["train", "--data", str(harvested), "--config", str(root / "t.toml"),
                     "--out", str(root / "ckpt")]) == 0
    meta = json.loads((root / "ckpt" / "meta.json").read_text())
    assert meta["train"]["node_weight"] == 1.0
    return root / "ckpt"


def test_evaluate_json_per_op(harvested, checkpoint, capsys):
    assert cli.main(["evaluate", "--checkpoint", str(checkpoint), "--data", str(harvested), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["held_out_families"] == ["llama"] and r["labelled_steps"] == 4
    assert 0.5 < r["matched_share"] <= 1.0001
    assert r["per_op"] and "matmul" in r["per_op"]
    for cat, v in r["per_op"].items():
        assert set(v) == {"mape", "share_measured", "share_predicted", "n"}
        assert v["mape"] >= 0 and 0 <= v["share_measured"] <= 1 and 0 <= v["share_predicted"] <= 1
        assert 1 <= v["n"] <= 4
    assert abs(sum(v["share_measured"] for v in r["per_op"].values()) - 1) < 1e-6
    assert r["op_share_error"]["top"] == 5 and r["op_share_error"]["mean_points"] >= 0
    assert cli.main(["evaluate", "--checkpoint", str(checkpoint), "--data", str(harvested)]) == 0
    assert "top-5 op share error" in capsys.readouterr().out


def test_predict_explain_with_a_node_label_checkpoint(checkpoint, capsys):
    argv = ["predict", "hf:llama", "--set", "num_hidden_layers=1", "--set", "hidden_size=32", "--set",
            "intermediate_size=64", "--set", "num_attention_heads=2", "--set", "num_key_value_heads=1",
            "--set", "head_dim=16", "--set", "vocab_size=100", "--batch-size", "2", "--seq-len", "8",
            "--checkpoint", str(checkpoint), "--precision", "fp32", "--explain", "--top", "3"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "trained with node labels from measured profiles (node_weight 1)" in out
    table = out.split("top 3 ops by predicted time (fp32")[1].splitlines()
    assert table[1].split() == ["op", "forward", "backward", "optimizer", "total", "share"]
    shares = [float(line.split()[-1].rstrip("%")) for line in table[2:6]]
    assert len(shares) == 4 and abs(sum(shares) - 100) < 0.3  # 3 ops + the rest: the whole step
    assert shares[0] >= shares[1] >= shares[2]


def test_predict_explain_shipped_cpu_checkpoint_across_classes(capsys):
    argv = ["predict", "hf:gpt2", "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2", "--set",
            "vocab_size=100", "--batch-size", "2", "--seq-len", "16", "--hardware", "cpu", "--precision", "all",
            "--explain"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    head = out.split("top 8 ops by predicted share in any class")[1].splitlines()[1]
    assert head.split() == ["op", "fp32", "amp-bf16", "bf16"]
    assert "per-op times from the per-node head of" in out


def test_predict_explain_analytic_h100(capsys):
    argv = ["predict", "hf:gpt2", "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2", "--set",
            "vocab_size=100", "--batch-size", "2", "--seq-len", "16", "--precision", "bf16", "--explain"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "per-op times from the calibrated physical prior (ANALYTIC ESTIMATE: no h100 checkpoint yet" in out
    assert "top 8 ops by predicted time (bf16" in out


@pytest.mark.parametrize("argv,names", [
    (["predict", "hf:gpt2", "--hardware", "cpu", "--explain", "--top", "0"], "--top"),
    (["predict", "hf:gpt2", "--hardware", "cpu", "--explain", "--top", "many"], "many"),
])
def test_explain_bad_input(argv, names, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and names in err


@pytest.mark.parametrize("config,names", [
    ("node_weight = -1\n", "node_weight"),
    ("node_weight = \"lots\"\n", "node_weight"),
    ("node_weight = 1.0\n[model]\nreadout = \"pool\"\n", "readout"),
])
def test_node_weight_bad_config(config, names, tmp_path, capsys):
    (tmp_path / "c.toml").write_text(config)
    code = cli.main(["train", "--data", str(REPO / "datasets" / "cpu"), "--config", str(tmp_path / "c.toml"),
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and names in err and "Traceback" not in err


def test_node_label_config_is_the_shipped_config_plus_node_weight():
    """training/cpu_nodes.toml differs from the shipped training/cpu.toml only in node_weight, so the two
    compare node labels and nothing else."""
    import dataclasses

    from gnn_ptp.train import load_train_config

    shipped = load_train_config(REPO / "training" / "cpu.toml")
    nodes = load_train_config(REPO / "training" / "cpu_nodes.toml")
    assert shipped.node_weight == 0 and nodes.node_weight > 0
    assert dataclasses.replace(nodes, node_weight=0.0) == shipped


def test_the_shipped_residual_config_is_the_node_label_config_over_the_prior():
    """training/cpu_nodes_prior.toml (checkpoints/cpu since 2026-11-26) differs from training/cpu_nodes.toml
    only in the model's target and hardware descriptor, since the thirty-eighth session in its labels
    (each configuration's fastest record), since the thirty-ninth in scaling its correction on the
    validation families, and since the forty-third in being a three-seed ensemble whose members draw their own
    validation families, so the README's comparison of the two checkpoints is of the residual over the prior
    on the uncontended step; the shipped checkpoint was trained with it and answers with its members' factors."""
    import dataclasses
    import json

    from gnn_ptp.train import load_train_config

    nodes = load_train_config(REPO / "training" / "cpu_nodes.toml")
    residual = load_train_config(REPO / "training" / "cpu_nodes_prior.toml")
    assert residual.model.target == "log_ratio_prior" and residual.model.hardware_descriptor
    assert nodes.model.target != "log_ratio_prior" and not nodes.model.hardware_descriptor
    plain = dataclasses.replace(residual.model, target=nodes.model.target,
                                hardware_descriptor=nodes.model.hardware_descriptor)
    assert residual.labels == "fastest" and nodes.labels == "mean"
    assert residual.scale_on_validation and not nodes.scale_on_validation
    assert residual.ensemble_seeds == (0, 1, 2) and residual.val_families is None and nodes.ensemble_seeds is None
    assert dataclasses.replace(residual, model=plain, labels=nodes.labels, scale_on_validation=False,
                               ensemble_seeds=None, val_families=nodes.val_families) == nodes
    meta = json.loads((REPO / "checkpoints" / "cpu" / "meta.json").read_text())
    assert meta["model"]["target"] == "log_ratio_prior" and meta["model"]["hardware_descriptor"]
    assert meta["train"]["node_weight"] == residual.node_weight and meta["train"]["labels"] == residual.labels
    assert meta["train"]["scale_on_validation"] is True and meta["train"]["ensemble_seeds"] == [0, 1, 2]
    assert [m["seed"] for m in meta["ensemble"]["members"]] == [0, 1, 2]
    assert all("chosen" in m["correction_scale"] for m in meta["ensemble"]["members"])
    from gnn_ptp import checkpoint
    from gnn_ptp.train import CORRECTION_SCALES

    for member in meta["ensemble"]["members"]:  # each its own factor, the best on its own validation families
        scaling = member["correction_scale"]
        assert scaling["chosen"] in CORRECTION_SCALES and checkpoint.correction_scale(member) == scaling["chosen"]
        assert scaling["val_mape"][f"{scaling['chosen']:g}"] == min(scaling["val_mape"].values())


def test_node_seconds_less_the_profilers_cost_on_a_real_harvest(harvested, labelled):
    """On the real CPU harvest: the folder's per-op cost is the median of its records' (each >= 0, one per
    phase), and node seconds with it are each at most the plain ones and at least ``PROFILER_FLOOR`` of them,
    smaller in sum wherever the cost is positive."""
    from gnn_ptp import match

    measured = labelled[0]
    cost = node_labels.profiler_cost_us(harvested)
    assert cost is not None and len(cost) == 3 and all(c >= 0 for c in cost)
    plain = node_labels.node_seconds(harvested, measured)
    less = node_labels.node_seconds(harvested, measured, profiler_cost=True)
    assert plain.keys() == less.keys() and plain
    for key in plain:
        for a, b in zip(plain[key], less[key]):
            ok = ~torch.isnan(a)
            assert torch.equal(ok, ~torch.isnan(b))
            assert (b[ok] <= a[ok] + 1e-12).all() and (b[ok] >= match.PROFILER_FLOOR * a[ok] - 1e-12).all()
            if max(cost) > 0:
                assert float(b[ok].sum()) < float(a[ok].sum())


def test_the_protocols_refit_takes_the_profilers_cost_when_asked(harvested, labelled):
    """``protocol.prior_refit(profiler_cost=True)`` (``evaluate --profiler-cost``): the CPU kind's fold fits
    read the node seconds less the profiler's cost and carry the option to ``prior_fit.fit``; without it the
    plain ones."""
    from gnn_ptp import protocol

    measured = labelled[0]
    plain = protocol.prior_refit([harvested], lambda m: None)
    less = protocol.prior_refit([harvested], lambda m: None, profiler_cost=True)
    (name,) = less.seconds
    assert less.options[name]["profiler_cost"] is True and not plain.options.get(name, {}).get("profiler_cost")
    want = node_labels.node_seconds(harvested, measured, profiler_cost=True)
    for key, tensors in want.items():
        for a, b in zip(tensors, less.seconds[name][key]):
            assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))


def test_the_protocols_refit_takes_the_depthwise_stride_when_asked(harvested):
    """``protocol.prior_refit(depthwise_stride=True)`` (``evaluate --depthwise-stride``): the CPU kind's fold
    fits carry the option to ``prior_fit.fit``; without it, none (the harvest's kind has no shipped section
    whose law has the term)."""
    from gnn_ptp import protocol

    plain = protocol.prior_refit([harvested], lambda m: None)
    strided = protocol.prior_refit([harvested], lambda m: None, depthwise_stride=True)
    (name,) = strided.seconds
    assert strided.options[name]["depthwise_stride"] is True
    assert not plain.options.get(name, {}).get("depthwise_stride")
