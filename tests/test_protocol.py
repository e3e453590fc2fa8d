"""The evaluation protocol (gnn_ptp/protocol.py, ``gnn-ptp evaluate --protocol``) and the GNN options it
compares (``ModelConfig.target = "log_ratio_prior"``, ``hardware_descriptor``), on the SYNTHETIC dataset
(made-up graphs and times, synthetic_data.py) with a tiny budget. The second hardware kind here is a
SYNTHETIC CPU (made-up rates, test_descriptor.synthetic_cpu): cross-hardware is unmeasured in this
repository, only the mechanism is tested."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil

import numpy as np
import pytest
import torch

from gnn_ptp import checkpoint, cli, dataset, descriptor, metrics, protocol, records
from gnn_ptp.baselines import GraphTotalsRidge
from gnn_ptp.errors import UserError
from gnn_ptp.model import ModelConfig, StepTimeGNN
from gnn_ptp.train import TrainConfig, predict_samples, train

from synthetic_data import FAMILIES, load_synthetic_graphs, write_synthetic_dataset
from test_descriptor import synthetic_cpu

TINY = TrainConfig(model=ModelConfig(hidden=16, depth=1), epochs=2, threads=1)
BUDGET = protocol.Budget(epochs=2, seeds=(0, 1), bootstrap=100, threads=1)
SLOW_CPU_MODEL = "Synthetic Slow CPU"
FAST_CPU_MODEL = "Synthetic Fast CPU"


@pytest.fixture
def synthetic_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)
    return write_synthetic_dataset(tmp_path / "synthetic-cpu")


@pytest.fixture
def two_cpus(tmp_path, monkeypatch):
    """Two SYNTHETIC dataset folders: the same made-up configurations on this project's CPU (records name
    'AMD EPYC') and on a made-up CPU with a quarter of its rates whose steps take 3x as long; descriptors
    of both in a temporary descriptor folder."""
    return _cpus(tmp_path, monkeypatch, (("home", "AMD EPYC", 1.0), ("slow", SLOW_CPU_MODEL, 3.0)))


@pytest.fixture
def three_cpus(tmp_path, monkeypatch):
    """``two_cpus`` and a third SYNTHETIC folder: a made-up CPU with twice the rates, steps in 0.6x."""
    return _cpus(tmp_path, monkeypatch, (("home", "AMD EPYC", 1.0), ("slow", SLOW_CPU_MODEL, 3.0),
                                         ("fast", FAST_CPU_MODEL, 0.6)))


def _cpus(tmp_path, monkeypatch, kinds):
    monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)
    folder = tmp_path / "descriptors"
    folder.mkdir()
    shutil.copy(descriptor.DESCRIPTOR_DIR / "amd-epyc.json", folder / "amd-epyc.json")
    descriptor.write(synthetic_cpu(0.25, descriptor.slug(SLOW_CPU_MODEL)), folder)
    descriptor.write(synthetic_cpu(2.0, descriptor.slug(FAST_CPU_MODEL)), folder)
    monkeypatch.setattr(descriptor, "DESCRIPTOR_DIR", folder)
    dirs = []
    for name, cpu_model, factor in kinds:
        src = write_synthetic_dataset(tmp_path / f"src-{name}")
        out = tmp_path / f"synthetic-{name}"
        out.mkdir()
        for r in records.iter_records(src):
            r["env"] = {"hardware": "cpu", "cpu_model": cpu_model}
            for k in dataset.PHASE_KEYS:
                r["timing"][k] = {q: v * factor if q != "n" else v for q, v in r["timing"][k].items()}
            records.append_record(r, out, "synthetic.jsonl")
        dirs.append(out)
    return dirs


# --- the model options -------------------------------------------------------------------------------


def test_model_config_validates_the_new_options():
    with pytest.raises(UserError, match="target 'log_ratio' is not one of log_ms, log_ratio_prior"):
        ModelConfig(target="log_ratio")
    with pytest.raises(UserError, match="hardware_descriptor"):
        ModelConfig(hardware_descriptor="yes")
    assert not ModelConfig().needs_hardware and ModelConfig(target="log_ratio_prior").needs_hardware


def _batch(synthetic_dir, hardware=None):
    from torch_geometric.data import Batch

    measured = dataset.measured_configs(synthetic_dir)
    samples = dataset.make_samples(measured, dataset.load_graphs(synthetic_dir, measured))
    if hardware is not None:
        descriptor.attach(samples, [hardware] * len(samples))
    return Batch.from_data_list(samples), samples


@pytest.mark.parametrize("readout", ["node_sum", "pool"])
def test_log_ratio_prior_with_a_zero_head_predicts_the_prior_times_exp_offset(synthetic_dir, readout):
    home = descriptor.stored_cpus()["amd-epyc"]
    batch, samples = _batch(synthetic_dir, home)
    torch.manual_seed(0)
    model = StepTimeGNN(ModelConfig(hidden=16, depth=1, readout=readout, target="log_ratio_prior")).eval()
    head = model.node_time[-1] if readout == "node_sum" else model.pool_time[-1]
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    model.time_offset.fill_(0.7)
    with torch.no_grad():
        out = model(batch)
    for i, s in enumerate(samples):
        for p in range(3):
            prior_ms = float(s.prior_log_ms[s.phase == p].double().exp().sum())
            assert math.exp(float(out["log_phase_ms"][i, p])) == pytest.approx(prior_ms * math.exp(0.7), rel=1e-4)


def test_the_descriptor_reaches_the_prediction_only_when_fed(synthetic_dir):
    home, slow = descriptor.stored_cpus()["amd-epyc"], synthetic_cpu(0.25)
    torch.manual_seed(0)
    fed = StepTimeGNN(ModelConfig(hidden=16, depth=1, hardware_descriptor=True)).eval()
    torch.manual_seed(0)
    plain = StepTimeGNN(ModelConfig(hidden=16, depth=1)).eval()
    with torch.no_grad():
        a, b = fed(_batch(synthetic_dir, home)[0]), fed(_batch(synthetic_dir, slow)[0])
        c, d = plain(_batch(synthetic_dir, home)[0]), plain(_batch(synthetic_dir, slow)[0])
    assert not torch.allclose(a["log_phase_ms"], b["log_phase_ms"])
    assert torch.equal(c["log_phase_ms"], d["log_phase_ms"])


def test_a_model_that_needs_hardware_says_so_when_it_has_none(synthetic_dir):
    model = StepTimeGNN(ModelConfig(hidden=16, depth=1, target="log_ratio_prior")).eval()
    with pytest.raises(UserError, match="needs a hardware descriptor"):
        model(_batch(synthetic_dir)[0])


def test_residual_checkpoint_records_the_option_and_descriptor_and_round_trips(synthetic_dir, tmp_path):
    cfg = dataclasses.replace(TINY, model=dataclasses.replace(TINY.model, target="log_ratio_prior",
                                                              hardware_descriptor=True))
    result = train(cfg, synthetic_dir, tmp_path / "ckpt", log=lambda _: None)
    model, meta = checkpoint.load(tmp_path / "ckpt")
    assert meta["model"]["target"] == "log_ratio_prior" and meta["model"]["hardware_descriptor"] is True
    assert meta["hardware_descriptor"]["name"] == "cpu"  # synthetic records carry no CPU model
    assert model.descriptor == descriptor.reference_cpu()
    # graphs without attached hardware (as evaluate and predict build them) get the checkpoint's
    batch, _ = _batch(synthetic_dir)
    attached, _ = _batch(synthetic_dir, descriptor.reference_cpu())
    with torch.no_grad():
        before, after, bare = result["model"].eval()(attached), model(attached), model(batch)
    for key in ("log_phase_ms", "log_node_ms"):
        assert torch.equal(before[key], after[key]) and torch.allclose(after[key], bare[key], atol=1e-5)
    state = torch.load(tmp_path / "ckpt" / "model.pt", weights_only=True)
    assert any(k.startswith("hw_in.") for k in state)


def test_a_checkpoint_from_before_the_options_still_loads(synthetic_dir, tmp_path):
    """A raw-log-time checkpoint (SYNTHETIC graphs; no shipped checkpoint is one since the nineteenth
    session) with its meta written as before target / hardware_descriptor existed."""
    train(TINY, synthetic_dir, tmp_path / "old", log=lambda _: None)
    meta = json.loads((tmp_path / "old" / "meta.json").read_text())
    assert meta["model"]["target"] == "log_ms"
    for key in ("target", "hardware_descriptor"):
        del meta["model"][key]
    (tmp_path / "old" / "meta.json").write_text(json.dumps(meta))
    model, meta = checkpoint.load(tmp_path / "old")
    assert "target" not in meta["model"]
    assert model.cfg.target == "log_ms" and not model.cfg.hardware_descriptor and model.descriptor is None


def test_one_checkpoint_trains_on_two_hardware_kinds_and_knows_each(two_cpus):
    """SYNTHETIC: two CPU kinds; the descriptor-fed residual model is trained on both and asked about each."""
    measured, samples, _ = protocol.load(two_cpus)
    assert {s.hardware_name for s in samples} == {"amd-epyc", "synthetic-slow-cpu"}
    cfg = dataclasses.replace(TINY, epochs=3, model=dataclasses.replace(TINY.model, target="log_ratio_prior",
                                                                        hardware_descriptor=True))
    split = dataset.family_split([s.family for s in samples], 0, test_fraction=0.0, test_families=[])
    parts = {n: [s for s in samples if split[s.family] == n] for n in ("train", "val", "test")}
    result = train(cfg, None, None, log=lambda _: None, prepared=(measured, samples, split, parts))
    pred = predict_samples(result["model"], samples)["pred_ms"][:, 3]
    home = np.array([s.hardware_name == "amd-epyc" for s in samples])
    # the same graphs: the slow CPU's prior is 4x, so its predictions are larger for every configuration
    assert (pred[~home] > pred[home]).all()


# --- noise floor and splits --------------------------------------------------------------------------


def test_repeats_are_kept_apart_by_hardware_kind(two_cpus):
    """SYNTHETIC: the two CPU kinds measured the same configurations (one 3x slower); a configuration's
    repeats, and so its noise floor, belong to one kind, never pooled across kinds."""
    _, samples, repeats = protocol.load(two_cpus)
    s = samples[0]
    twin = next(x for x in samples if x.key == s.key and x.hardware_name != s.hardware_name)
    assert protocol.repeat_key(s) in repeats and protocol.repeat_key(twin) in repeats
    a, b = repeats[protocol.repeat_key(s)], repeats[protocol.repeat_key(twin)]
    assert max(a) < min(b) or max(b) < min(a)  # 3x apart: pooled, they would look like noise
    assert all(isinstance(k, tuple) for k in repeats)


def test_noise_floor_closed_form():
    from gnn_ptp.noise import c4

    repeats = {("h", "a"): [100.0, 110.0], ("h", "b"): [50.0, 50.0, 50.0], ("h", "c"): [10.0]}
    sd_a = np.std([100.0, 110.0], ddof=1) / c4(2) / 105.0
    # every configuration pools the (here: all) repeated ones of its hardware, a's noise and b's none
    pooled = (sd_a + 0.0) / 2
    expected = [math.sqrt(2 / math.pi) * pooled / math.sqrt(n) * 100 for n in (2, 3, 1)]
    assert protocol.noise_floor([("h", "a")], repeats) == pytest.approx(expected[0])
    assert protocol.noise_floor([("h", "a"), ("h", "b"), ("h", "c")], repeats) == pytest.approx(np.mean(expected))
    # measured once, it still has a floor: the full single-measurement noise of its neighbours
    assert protocol.noise_floor([("h", "c")], repeats) == pytest.approx(expected[2])
    # another hardware's repeats say nothing about this one's noise
    assert protocol.noise_floor([("other", "c")], {("other", "c"): [10.0], **repeats}) is None


def test_size_split_trains_on_the_smaller_half_and_tests_at_4x_its_largest(synthetic_dir):
    _, samples = _batch(synthetic_dir)
    split = protocol.size_split(samples, seed=0, factor=1.5)
    train_, val, test = split["train"], split["val"], split["test"]
    assert len(train_) + len(val) == len(samples) // 2 and test
    top = max(protocol.step_flops(s) for s in train_ + val)
    assert top == split["train_max_flops"]
    assert all(protocol.step_flops(s) >= 1.5 * top for s in test)
    assert not {s.key for s in test} & {s.key for s in train_ + val}
    others = [s for s in samples if s.key not in {x.key for x in train_ + val}]
    assert all(protocol.step_flops(s) >= top for s in others)


# --- the protocols -----------------------------------------------------------------------------------


def test_lofo_holds_every_family_out_once_per_seed_and_scores_consistently(synthetic_dir):
    r = protocol.run("lofo", synthetic_dir, TINY, BUDGET, log=lambda _: None)
    assert r["families"] == sorted(FAMILIES)
    assert [(f["seed"], f["test"]) for f in r["folds"]] == [(s, f) for s in (0, 1) for f in sorted(FAMILIES)]
    assert all(f["test"] not in f["val"] for f in r["folds"])
    assert set(r["predictors"]) == {"gnn", "gnn-prior", protocol.HALF, protocol.SCALED, "ridge", "prior",
                                    protocol.LOFO_SCALED, protocol.ENSEMBLE, protocol.SCALED_ENSEMBLE}
    for p, sc in r["predictors"].items():
        per = {f: row["mape"] for f, row in sc["per_group"].items()}
        assert sc["mean_mape"] == pytest.approx(np.mean(list(per.values())))
        assert sc["worst_mape"] == max(per.values()) and per[sc["worst_family"]] == sc["worst_mape"]
        assert sc["mean_mape"] == pytest.approx(np.mean(list(sc["per_seed_mean_mape"].values())))
        assert sc["mean_ci95"][0] <= sc["mean_ci95"][1] and sc["worst_ci95"][0] <= sc["worst_ci95"][1]
        assert all(row["n"] == 4 for row in sc["per_group"].values())
    assert r["ratios"]["gnn mean_mape"] == pytest.approx(r["predictors"]["ridge"]["mean_mape"]
                                                         / r["predictors"]["gnn"]["mean_mape"])
    # synthetic records are measured once: no noise floor to show, and it says so (None), not 0
    assert r["noise_floor"] is None
    # a CPU's prior comes from microbenchmarks, not from the data: used as shipped, nothing refitted
    assert r["prior_refitted"] == [] and not any("prior_refit" in f for f in r["folds"])
    json.dumps(r)


def test_the_seed_ensemble_is_each_family_s_geometric_mean_over_seeds_and_needs_two_seeds(synthetic_dir):
    budget = dataclasses.replace(BUDGET, seeds=(0, 1, 2), families=tuple(FAMILIES[:2]), variants=("gnn-prior",))
    r = protocol.run("lofo", synthetic_dir, RESIDUAL, budget, log=lambda _: None)
    assert list(r["predictors"])[-2:] == [protocol.ENSEMBLE, protocol.SCALED_ENSEMBLE]
    assert protocol.BEYOND_ENSEMBLE not in r["predictors"]  # without scale_beyond_range: no such row
    for row, name in protocol.ENSEMBLED.items():
        if row == protocol.BEYOND:
            continue
        sc = r["predictors"][name]
        assert list(sc["per_seed_mean_mape"]) == ["0+1+2"]
        for family in FAMILIES[:2]:
            folds = [f for f in r["folds"] if f["test"] == family]
            assert len(folds) == 3 and all(f["keys"] == folds[0]["keys"] for f in folds)
            geo = np.prod([np.array(f["pred_ms"][row]) for f in folds], axis=0) ** (1 / 3)
            assert sc["per_group"][family]["mape"] == pytest.approx(metrics.ape(geo, np.array(folds[0]["true_ms"])).mean())
        assert r["ratios"][f"{name} mean_mape"] == pytest.approx(r["predictors"]["ridge"]["mean_mape"] / sc["mean_mape"])
    assert f"{protocol.SCALED_ENSEMBLE} " in protocol.format_result(r)
    # one seed: no ensemble rows; folds of different configurations cannot be ensembled
    assert protocol.ensemble_errors(r["folds"], (0,), lambda f: f["test"]) == {}
    broken = json.loads(json.dumps(r["folds"]))
    broken[0]["keys"] = broken[0]["keys"][::-1]
    with pytest.raises(ValueError, match="test different configurations"):
        protocol.ensemble_errors(broken, (0, 1, 2), lambda f: f["test"])


def test_lofo_ridge_and_prior_rows_are_recomputable_from_the_fold(synthetic_dir):
    family = FAMILIES[0]
    budget = dataclasses.replace(BUDGET, seeds=(0,), families=(family,), variants=("gnn",))
    r = protocol.run("lofo", synthetic_dir, TINY, budget, log=lambda _: None)
    measured, samples, _ = protocol.load([synthetic_dir])
    split = dataset.family_split([s.family for s in samples], 0, test_families=[family])
    parts = {n: [s for s in samples if split[s.family] == n] for n in ("train", "val", "test")}
    true = np.exp([float(s.y[0, 3]) for s in parts["test"]])
    ridge = GraphTotalsRidge().fit(parts["train"], parts["val"]).predict_ms(parts["test"])[:, 3]
    assert r["predictors"]["ridge"]["mean_mape"] == pytest.approx(metrics.ape(ridge, true).mean())
    prior_ms = [float(s.prior_log_ms.double().exp().sum()) for s in parts["test"]]
    assert r["predictors"]["prior"]["mean_mape"] == pytest.approx(metrics.ape(prior_ms, true).mean())
    assert r["folds"][0]["val"] == sorted(f for f, s in split.items() if s == "val")


def test_folds_keep_their_predictions_and_the_half_residual_is_the_geometric_mean(synthetic_dir):
    budget = dataclasses.replace(BUDGET, seeds=(0,), families=(FAMILIES[0],), variants=("gnn-prior",))
    r = protocol.run("lofo", synthetic_dir, TINY, budget, log=lambda _: None)
    fold, = r["folds"]
    pred, true = fold["pred_ms"], np.array(fold["true_ms"])
    assert len(fold["keys"]) == len(true) == fold["n_test"] == 4 and set(pred) == set(r["predictors"])
    half = np.sqrt(np.array(pred["gnn-prior"]) * np.array(pred["prior"]))
    assert np.array(pred[protocol.HALF]) == pytest.approx(half, rel=1e-3)
    for p, values in pred.items():  # the stored predictions give the scores (to their 4 digits)
        assert metrics.ape(np.array(values), true).mean() == pytest.approx(
            r["predictors"][p]["mean_mape"], rel=2e-3, abs=1e-3)


# --- the correction's scale ----------------------------------------------------------------------------


@pytest.mark.parametrize("readout", ["node_sum", "pool", "queue"])
def test_a_correction_scale_of_zero_answers_the_prior_and_scales_the_log_correction(synthetic_dir, readout):
    """``StepTimeGNN.correction_scale`` on a random SYNTHETIC residual model: 0 gives what a zeroed head gives
    (the prior: node_sum and pool with no offset, queue with its host costs as priced), 1 the model as
    learnt, and between them each node's (pool: each phase's) log-correction scales linearly."""
    batch, _ = _batch(synthetic_dir, descriptor.stored_cpus()["amd-epyc"])
    torch.manual_seed(0)
    model = StepTimeGNN(ModelConfig(hidden=16, depth=1, readout=readout, target="log_ratio_prior")).eval()
    model.time_offset.fill_(0.7)
    if readout == "queue":
        torch.nn.init.normal_(model.host_scale[-1].weight, std=0.5)
    with torch.no_grad():
        full = model(batch)
        model.correction_scale = 0.5
        half = model(batch)
        model.correction_scale = 0.0
        none = model(batch)
        model.correction_scale = 1.0
        assert torch.equal(model(batch)["log_phase_ms"], full["log_phase_ms"])
        heads = [model.node_time[-1] if readout != "pool" else model.pool_time[-1]]
        heads += [model.host_scale[-1]] if readout == "queue" else []
        for head in heads:
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
        model.time_offset.fill_(0.0)
        zeroed = model(batch)
    assert torch.allclose(none["log_phase_ms"], zeroed["log_phase_ms"], atol=1e-5)
    assert not torch.allclose(full["log_phase_ms"], none["log_phase_ms"], atol=1e-2)
    key = "log_phase_ms" if readout == "pool" else ("log_kernel_ms" if readout == "queue" else "log_node_ms")
    assert torch.allclose(half[key], (full[key] + none[key]) / 2, atol=1e-5)


RESIDUAL = dataclasses.replace(TINY, model=dataclasses.replace(TINY.model, target="log_ratio_prior",
                                                               hardware_descriptor=True))


def test_train_chooses_the_scale_on_validation_and_the_checkpoint_answers_with_it(synthetic_dir, tmp_path):
    cfg = dataclasses.replace(RESIDUAL, scale_on_validation=True)
    lines = []
    result = train(cfg, synthetic_dir, tmp_path / "ckpt", log=lines.append)
    scaling = result["correction_scale"]
    val_mape = {float(k): v for k, v in scaling["val_mape"].items()}
    assert sorted(val_mape) == sorted(protocol_scales()) and set(scaling["test_mape"]) == set(scaling["val_mape"])
    best = min(val_mape.values())
    assert scaling["chosen"] == min(k for k, v in val_mape.items() if v == best)  # the smaller on a tie
    assert any(line.startswith(f"correction to the prior scaled by {scaling['chosen']:g}") for line in lines)
    model, meta = checkpoint.load(tmp_path / "ckpt")
    assert meta["correction_scale"] == json.loads(json.dumps(scaling)) and model.correction_scale == scaling["chosen"]
    split = meta["split"]
    measured = dataset.measured_configs(synthetic_dir)
    samples = dataset.make_samples(measured, dataset.load_graphs(synthetic_dir, measured))
    chosen_test = scaling["test_mape"][f"{scaling['chosen']:g}"]
    for part, figure in (("val", val_mape[scaling["chosen"]]), ("test", chosen_test)):
        p = predict_samples(model, [s for s in samples if split[s.family] == part])
        assert metrics.ape(p["pred_ms"][:, 3], p["true_ms"][:, 3]).mean() == pytest.approx(figure, rel=1e-4)
    assert meta["metrics"]["test"]["overall"]["mape"] == pytest.approx(
        scaling["test_mape"][f"{scaling['chosen']:g}"], rel=1e-4)
    plain = train(RESIDUAL, synthetic_dir, None, log=lambda _: None)  # the same training without it: factor 1
    assert "correction_scale" not in plain and plain["model"].correction_scale == 1.0
    assert plain["val_mape"] == pytest.approx(result["val_mape"]) == pytest.approx(val_mape[1.0], rel=1e-4)


def test_evaluate_scores_a_scaled_checkpoint_as_it_answers_and_says_so(synthetic_dir, tmp_path):
    from gnn_ptp.evaluate import evaluate, format_table

    train(dataclasses.replace(RESIDUAL, scale_on_validation=True), synthetic_dir, tmp_path / "ckpt",
          log=lambda _: None)
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    chosen = meta["correction_scale"]["chosen"]
    meta["correction_scale"]["chosen"] = chosen = 0.5 if chosen == 1.0 else chosen  # a factor the table names
    (tmp_path / "ckpt" / "meta.json").write_text(json.dumps(meta))
    r = evaluate(tmp_path / "ckpt", synthetic_dir, log=lambda _: None)
    assert r["correction_scale"] == chosen
    assert r["overall"]["mape"] == pytest.approx(meta["correction_scale"]["test_mape"][f"{chosen:g}"], rel=1e-4)
    assert f"gnn: its learnt correction to the prior scaled by {chosen:g}, the factor its validation" in format_table(r)


def protocol_scales():
    from gnn_ptp.train import CORRECTION_SCALES

    return CORRECTION_SCALES


def test_scale_on_validation_is_checked_and_a_damaged_factor_refused(synthetic_dir, tmp_path):
    with pytest.raises(UserError, match=r'scale_on_validation = true scales a correction to the physical prior: '
                                        r'it needs \[model\] target = "log_ratio_prior", not \'log_ms\''):
        TrainConfig.from_dict({"scale_on_validation": True})
    with pytest.raises(UserError, match="scale_on_validation = 'yes' must be true or false"):
        TrainConfig.from_dict({"scale_on_validation": "yes", "model": {"target": "log_ratio_prior"}})
    train(dataclasses.replace(RESIDUAL, scale_on_validation=True), synthetic_dir, tmp_path / "ckpt",
          log=lambda _: None)
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    meta["correction_scale"]["chosen"] = 2.0
    (tmp_path / "ckpt" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"correction_scale.chosen = 2.0 is not a factor between 0 and 1"):
        checkpoint.load(tmp_path / "ckpt")


@pytest.mark.parametrize("scales,same_as", [((0.0,), "prior"), ((1.0,), "gnn-prior")])
def test_the_scaled_residual_of_a_fold_is_the_prior_at_zero_and_the_residual_at_one(synthetic_dir, monkeypatch,
                                                                                     scales, same_as):
    from gnn_ptp import train as train_mod

    monkeypatch.setattr(train_mod, "CORRECTION_SCALES", scales)
    budget = dataclasses.replace(BUDGET, seeds=(0,), families=(FAMILIES[0],), variants=("gnn-prior",))
    r = protocol.run("lofo", synthetic_dir, dataclasses.replace(RESIDUAL, scale_on_validation=True), budget,
                     log=lambda _: None)
    fold, = r["folds"]
    assert fold[protocol.SCALED]["correction_scale"] == scales[0]
    assert np.array(fold["pred_ms"][protocol.SCALED]) == pytest.approx(np.array(fold["pred_ms"][same_as]), rel=2e-3)
    assert f"{protocol.SCALED}: the factor on the correction chosen on each fold's validation families: " \
           f"{scales[0]:g} in 1 of 1 folds" in protocol.format_result(r)


def test_the_factor_across_folds_is_each_family_s_best_on_the_other_families_and_blind_to_its_own():
    """``protocol.scale_across_folds`` on SYNTHETIC folds: a correction that halves the error of three families
    and doubles that of a fourth."""
    rng = np.random.default_rng(0)
    folds = {}
    for family, helps in (("a", True), ("b", True), ("c", True), ("d", False)):
        true = rng.uniform(10, 100, 20)
        prior = true * np.exp(rng.normal(0.2, 0.05, 20))
        need = np.log(true / prior)
        residual = prior * np.exp(need / 2 if helps else -need)
        folds[family] = (true, prior, residual)
    scales = (0.0, 0.25, 0.5, 0.75, 1.0)
    chosen, by_factor = protocol.scale_across_folds(folds, scales)

    def mape(f, s):
        true, prior, residual = folds[f]
        return metrics.ape(prior * (residual / prior) ** s, true).mean()

    for f in folds:  # brute force: the factor with the lowest mean over the other families
        others = [g for g in folds if g != f]
        assert chosen[f] == min(scales, key=lambda s: (np.mean([mape(g, s) for g in others]), s))
    assert chosen["d"] == 1.0 and chosen["a"] < 1.0  # d's own harm does not reach its factor; a's does
    assert by_factor == pytest.approx({s: np.mean([mape(f, s) for f in folds]) for s in scales})
    moved = dict(folds, d=(folds["d"][0] * 3, *folds["d"][1:]))  # d's labels change: its own factor cannot
    assert protocol.scale_across_folds(moved, scales)[0]["d"] == chosen["d"]
    flat = {f: (t, p, p) for f, (t, p, _) in folds.items()}  # no correction: every factor ties, 0 is taken
    assert set(protocol.scale_across_folds(flat, scales)[0].values()) == {0.0}


def test_lofo_scores_the_factor_across_folds_from_its_own_fold_records(synthetic_dir):
    budget = dataclasses.replace(BUDGET, seeds=(0,), variants=("gnn-prior",))
    r = protocol.run("lofo", synthetic_dir, RESIDUAL, budget, log=lambda _: None)
    assert list(r["predictors"])[-1] == protocol.LOFO_SCALED
    folds = {f["test"]: tuple(np.array(v) for v in (f["true_ms"], f["pred_ms"]["prior"], f["pred_ms"]["gnn-prior"]))
             for f in r["folds"]}
    chosen, by_factor = protocol.scale_across_folds(folds)  # from the stored 4-digit predictions
    per = r["predictors"][protocol.LOFO_SCALED]["per_group"]
    for f in r["folds"]:
        factor = f[protocol.LOFO_SCALED]["correction_scale"]
        assert factor == chosen[f["test"]]
        true, prior, residual = folds[f["test"]]
        assert per[f["test"]]["mape"] == pytest.approx(metrics.ape(prior * (residual / prior) ** factor, true).mean(),
                                                       rel=2e-3, abs=1e-3)
    row = r["lofo_scale"]["0"]
    assert row["chosen"] == min(by_factor, key=lambda s: (by_factor[s], s))
    assert [float(k) for k in row["mean_mape_by_factor"]] == sorted(by_factor)
    text = protocol.format_result(r)
    assert f"{protocol.LOFO_SCALED}: the factor chosen for each family on the other families' folds: " in text
    assert f"over every family (seed 0) the protocol chooses {row['chosen']:g}; mean of families by factor: 0 " in text
    # benchmarks/lofo_scale.py re-scores stored runs: on this one it gives the protocol's own row
    from conftest import benchmark_module

    rescored, = benchmark_module("lofo_scale").rescore(json.loads(json.dumps(r)))
    assert rescored["across"] == pytest.approx(r["predictors"][protocol.LOFO_SCALED]["mean_mape"], rel=2e-3, abs=1e-3)
    assert rescored["whole"] == row["chosen"] and sum(rescored["factors"].values()) == len(r["folds"])
    assert rescored["stored"]["prior"] == pytest.approx(r["predictors"]["prior"]["mean_mape"], rel=2e-3, abs=1e-3)


def test_a_fixed_correction_scale_is_checked_trained_with_and_named_where_it_answers(synthetic_dir, tmp_path):
    from gnn_ptp.evaluate import evaluate, format_table
    from gnn_ptp.prediction import checkpoint_error

    for bad, said in ((True, "correction_scale = True must be a number from 0"),
                      (1.5, "correction_scale = 1.5 must be a number from 0 (the prior alone) to 1"),
                      ("half", "correction_scale = 'half' must be a number")):
        with pytest.raises(UserError, match=re.escape(said)):
            TrainConfig.from_dict({"correction_scale": bad, "model": {"target": "log_ratio_prior"}})
    with pytest.raises(UserError, match=r'correction_scale scales a correction to the physical prior: it needs'):
        TrainConfig.from_dict({"correction_scale": 0.5})
    with pytest.raises(UserError, match="both set the factor on the correction; keep one"):
        TrainConfig.from_dict({"correction_scale": 0.5, "scale_on_validation": True,
                               "model": {"target": "log_ratio_prior"}})
    lines = []
    result = train(dataclasses.replace(RESIDUAL, correction_scale=0.25), synthetic_dir, tmp_path / "ckpt",
                   log=lines.append)
    scaling = result["correction_scale"]
    assert scaling["chosen"] == 0.25 and scaling["chosen_by"] == "config"
    assert "correction to the prior scaled by 0.25, the training config's fixed factor" in lines
    plain = train(RESIDUAL, synthetic_dir, None, log=lambda _: None)  # same weights, factor 1
    assert scaling["val_mape"]["1"] == pytest.approx(plain["val_mape"], rel=1e-4)
    model, meta = checkpoint.load(tmp_path / "ckpt")
    assert model.correction_scale == 0.25 and checkpoint.scale_source(meta) == "config"
    assert meta["metrics"]["test"]["overall"]["mape"] == pytest.approx(scaling["test_mape"]["0.25"], rel=1e-4)
    r = evaluate(tmp_path / "ckpt", synthetic_dir, log=lambda _: None)
    assert r["overall"]["mape"] == pytest.approx(scaling["test_mape"]["0.25"], rel=1e-4)
    assert "gnn: its learnt correction to the prior scaled by 0.25, the fixed factor of its training config" \
        in format_table(r)
    assert "scaled by 0.25, the fixed factor of its training config" in checkpoint_error(meta, None)["summary"]


PARALLEL_SCRIPT = """
import dataclasses, json, sys
from gnn_ptp import dataset, protocol
from gnn_ptp.model import ModelConfig
from gnn_ptp.train import TrainConfig
from synthetic_data import FAMILIES, load_synthetic_graphs, write_synthetic_dataset
dataset.load_graphs = load_synthetic_graphs
data = write_synthetic_dataset(sys.argv[1])
tiny = TrainConfig(model=ModelConfig(hidden=16, depth=1), epochs=2, threads=1)
budget = protocol.Budget(epochs=2, seeds=(0,), families=tuple(FAMILIES[:3]), bootstrap=50, threads=1)
lines = []
out = {}
for jobs in (2, 1):  # forked workers first: this fresh process has not run autograd yet
    r = protocol.run("lofo", data, tiny, dataclasses.replace(budget, jobs=jobs), log=lines.append)
    out[jobs] = [(f["test"], f["pred_ms"]) for f in r["folds"]]
print(json.dumps({"folds": out, "log": lines}))
"""


def test_folds_in_forked_processes_give_the_sequential_results(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    run = subprocess.run([sys.executable, "-c", PARALLEL_SCRIPT, str(tmp_path / "synthetic")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["folds"]["2"] == r["folds"]["1"] and len(r["folds"]["2"]) == 3
    assert not any("one at a time" in line for line in r["log"])  # the workers did train


def autograd_fork_failure(index: int):
    """What a forked fold worker meets when its parent ran autograd on other threads (torch's error)."""
    raise RuntimeError("Unable to handle autograd's threading in combination with fork-based multiprocessing.")


def test_jobs_fall_back_to_one_at_a_time_when_forked_workers_cannot_train(synthetic_dir, monkeypatch):
    budget = dataclasses.replace(BUDGET, seeds=(0,), families=tuple(FAMILIES[:3]))
    one = protocol.run("lofo", synthetic_dir, TINY, budget, log=lambda _: None)
    monkeypatch.setattr(protocol, "_fold_worker", autograd_fork_failure)
    lines = []
    two = protocol.run("lofo", synthetic_dir, TINY, dataclasses.replace(budget, jobs=2), log=lines.append)
    assert [(f["seed"], f["test"]) for f in two["folds"]] == [(f["seed"], f["test"]) for f in one["folds"]]
    for a, b in zip(one["folds"], two["folds"]):
        assert a["pred_ms"] == b["pred_ms"] and a["keys"] == b["keys"]
    assert {p: sc["mean_mape"] for p, sc in two["predictors"].items()} == pytest.approx(
        {p: sc["mean_mape"] for p, sc in one["predictors"].items()})
    assert sum("the remaining folds run one at a time" in x for x in lines) == 1
    assert len([x for x in lines if x.startswith("lofo seed 0")]) == 3
    with pytest.raises(UserError, match="jobs = 0: must be a positive integer"):
        protocol.Budget(jobs=0)


def test_size_protocol_reports_the_split_and_every_predictor(synthetic_dir, monkeypatch):
    monkeypatch.setattr(protocol, "SIZE_FACTOR", 1.5)
    r = protocol.run("size", synthetic_dir, TINY, BUDGET, log=lambda _: None)
    fold = r["folds"][0]
    assert fold["test_min_flops"] >= 1.5 * fold["train_max_flops"]
    # no families to choose a factor across: the size protocol has no such row
    assert set(r["predictors"]) == {"gnn", "gnn-prior", protocol.HALF, protocol.SCALED, "ridge", "prior",
                                    protocol.ENSEMBLE, protocol.SCALED_ENSEMBLE}
    assert all(sc["n"] == fold["n_test"] and sc["ci95"][0] <= sc["ci95"][1] for sc in r["predictors"].values())
    assert "size" in protocol.format_result(r)
    # both seeds test the same configurations: the ensemble prices each at the seeds' geometric mean
    a, b = r["folds"]
    assert a["keys"] == b["keys"]
    for row, name in protocol.ENSEMBLED.items():
        if row == protocol.BEYOND:  # without scale_beyond_range: no such row (tests/test_beyond_scale.py)
            continue
        geo = np.sqrt(np.array(a["pred_ms"][row]) * np.array(b["pred_ms"][row]))
        assert r["predictors"][name]["mape"] == pytest.approx(metrics.ape(geo, np.array(a["true_ms"])).mean())
        assert r["predictors"][name]["per_seed_mape"] == {"0+1": pytest.approx(r["predictors"][name]["mape"])}


def test_size_protocol_refuses_data_without_the_range(synthetic_dir, monkeypatch):
    monkeypatch.setattr(protocol, "SIZE_FACTOR", 1e9)
    with pytest.raises(UserError, match="no configuration has 1e[+]09x the FLOPs"):
        protocol.run("size", synthetic_dir, TINY, BUDGET, log=lambda _: None)


def test_hardware_protocol_trains_on_one_synthetic_cpu_and_tests_on_the_other(two_cpus):
    budget = dataclasses.replace(BUDGET, seeds=(0,))
    r = protocol.run("hardware", two_cpus, TINY, budget, log=lambda _: None)
    assert set(r["pairs"]) == {"amd-epyc -> synthetic-slow-cpu", "synthetic-slow-cpu -> amd-epyc"}
    assert r["kinds"] == {"amd-epyc": 24, "synthetic-slow-cpu": 24}
    for row in r["pairs"].values():
        assert row["n_test"] == 24
        assert set(row["predictors"]) == {"gnn", "gnn-prior", protocol.HALF, protocol.SCALED, "ridge", "prior"}
    text = protocol.format_result(r)
    assert "amd-epyc -> synthetic-slow-cpu" in text


def test_with_three_kinds_the_hardware_protocol_also_leaves_each_kind_out_of_the_other_two(three_cpus):
    budget = dataclasses.replace(BUDGET, seeds=(0,), variants=("gnn-prior",), hardware_folds="rest", jobs=2)
    r = protocol.run("hardware", three_cpus, TINY, budget, log=lambda _: None)
    rest = "amd-epyc + synthetic-fast-cpu -> synthetic-slow-cpu"
    assert set(r["pairs"]) == {rest, "amd-epyc + synthetic-slow-cpu -> synthetic-fast-cpu",
                               "synthetic-fast-cpu + synthetic-slow-cpu -> amd-epyc"}
    assert r["pairs"][rest]["train_kinds"] == ["amd-epyc", "synthetic-fast-cpu"]
    fold = next(f for f in r["folds"] if f["test"] == "synthetic-slow-cpu")
    assert len(fold["keys"]) == 24 and set(fold["mape_by_precision"]["prior"]) == {"fp32", "amp-bf16"}
    assert rest in protocol.format_result(r)


def test_lofo_over_two_kinds_leaves_a_family_out_of_both_and_scores_each_kind_alone(two_cpus):
    """SYNTHETIC: two CPU kinds' folders in one leave-one-family-out run: each fold's test holds the family on
    both kinds (never trained on either), and each kind's rows are the folds' own predictions of its
    configurations."""
    budget = dataclasses.replace(BUDGET, seeds=(0,), variants=("gnn-prior",))
    r = protocol.run("lofo", two_cpus, TINY, budget, log=lambda _: None)
    assert set(r["by_kind"]) == {"amd-epyc", "synthetic-slow-cpu"}
    per_kind = {k: {} for k in r["by_kind"]}
    for f in r["folds"]:
        assert sorted(set(f["hardware"])) == ["amd-epyc", "synthetic-slow-cpu"]
        assert f["hardware"].count("amd-epyc") == f["hardware"].count("synthetic-slow-cpu") == f["n_test"] // 2
        hw, true = np.array(f["hardware"]), np.array(f["true_ms"])
        for kind in per_kind:
            mask = hw == kind
            per_kind[kind][f["test"]] = metrics.ape(np.array(f["pred_ms"]["prior"])[mask], true[mask]).mean()
    for kind, row in r["by_kind"].items():
        assert row["n"] == 24
        assert set(row["predictors"]) == set(r["predictors"])
        assert row["predictors"]["prior"]["mean_mape"] == pytest.approx(np.mean(list(per_kind[kind].values())))
        assert row["predictors"]["prior"]["per_group"].keys() == per_kind[kind].keys()
    # the pooled row weighs both kinds: its family MAPE lies between the kinds' (same configurations on each)
    for fam, pooled in r["predictors"]["prior"]["per_group"].items():
        lo, hi = sorted(per_kind[k][fam] for k in per_kind)
        assert lo - 1e-3 <= pooled["mape"] <= hi + 1e-3
    text = protocol.format_result(r)
    assert "scored on amd-epyc alone (24 configurations" in text and "scored on synthetic-slow-cpu alone" in text
    one = protocol.run("lofo", two_cpus[0], TINY, budget, log=lambda _: None)
    assert "by_kind" not in one and "hardware" not in one["folds"][0]


def test_lofo_over_several_folders_refuses_what_one_model_cannot_learn(two_cpus, tmp_path, capsys):
    """SYNTHETIC: the plain GNN without descriptors over two kinds, and a CPU folder beside a GPU one: one line,
    exit 2, before any graph is traced."""
    folders = [str(d) for d in two_cpus]
    code = cli.main(["evaluate", "--protocol", "lofo", "--data", *folders, "--variants", "gnn", "--epochs", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "variant gnn needs [model] hardware_descriptor = true" in err and "--variants gnn-prior" in err
    gpu = tmp_path / "synthetic-gpu"
    gpu.mkdir()
    for r in records.iter_records(two_cpus[0]):
        r["hardware"], r["env"] = "h100", {"hardware": "h100"}
        records.append_record(r, gpu, "synthetic.jsonl")
    code = cli.main(["evaluate", "--protocol", "size", "--data", folders[0], str(gpu), "--variants", "gnn-prior"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "train CPU and GPU hardware apart" in err


def test_size_over_two_kinds_scores_each_kind_alone(two_cpus):
    """SYNTHETIC: the size protocol over two CPU kinds' folders: each kind's row is the fold's own predictions
    of that kind's test configurations."""
    budget = dataclasses.replace(BUDGET, seeds=(0,), variants=("gnn-prior",))
    r = protocol.run("size", two_cpus, TINY, budget, log=lambda _: None)
    fold, = r["folds"]
    hw, true = np.array(fold["hardware"]), np.array(fold["true_ms"])
    assert set(r["by_kind"]) == set(hw) == {"amd-epyc", "synthetic-slow-cpu"}
    for kind, row in r["by_kind"].items():
        mask = hw == kind
        assert row["n"] == mask.sum()
        assert row["predictors"]["prior"]["mean_mape"] == pytest.approx(
            metrics.ape(np.array(fold["pred_ms"]["prior"])[mask], true[mask]).mean())
    assert "scored on synthetic-slow-cpu alone" in protocol.format_result(r)


def test_the_hardware_protocol_s_folds_pairs_and_the_rest():
    folds = protocol.hardware_folds
    assert folds(["a", "b"]) == folds(["a", "b"], "rest") == [(("a",), "b"), (("b",), "a")]
    three = ["a", "b", "c"]
    assert len(folds(three, "pairs")) == 6
    assert folds(three, "rest") == [(("b", "c"), "a"), (("a", "c"), "b"), (("a", "b"), "c")]
    assert folds(three) == folds(three, "pairs") + folds(three, "rest")
    assert folds(three, "rest", test="b") == [(("a", "c"), "b")]  # a new kind scored once against the rest
    assert folds(three, "all", test="b") == [(("a",), "b"), (("c",), "b"), (("a", "c"), "b")]
    with pytest.raises(UserError, match="--hardware-test 'bb': not a hardware kind of the data; its kinds: a, b, c"):
        folds(three, "rest", test="bb")
    with pytest.raises(UserError, match="hardware folds 'rset': allowed: pairs, rest, all.*rest"):
        protocol.Budget(hardware_folds="rset")
    with pytest.raises(UserError, match="hardware transfer 'nearst': allowed: nearest, mean.*nearest"):
        protocol.Budget(hardware_transfer="nearst")
    with pytest.raises(UserError, match="transfer mode 'splt': allowed: ceilings, split"):
        protocol.Budget(transfer_mode="splt")


def test_cli_protocol_json_and_the_one_kind_refusal(synthetic_dir, capsys, monkeypatch):
    code = cli.main(["evaluate", "--protocol", "lofo", "--data", str(synthetic_dir), "--epochs", "1",
                     "--families", f"{FAMILIES[0]},{FAMILIES[1]}", "--variants", "gnn-prior", "--threads", "1",
                     "--bootstrap", "50", "--json"])
    assert code == 0
    r = json.loads(capsys.readouterr().out)
    assert r["families"] == [FAMILIES[0], FAMILIES[1]]
    assert set(r["predictors"]) == {"gnn-prior", protocol.HALF, protocol.SCALED, "ridge", "prior",
                                    protocol.LOFO_SCALED}
    code = cli.main(["evaluate", "--protocol", "hardware", "--data", str(synthetic_dir)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "needs records of two hardware kinds or more; the data holds one: cpu (24 configurations)" in err
    code = cli.main(["evaluate", "--protocol", "lofo", "--data", str(synthetic_dir), "--families", "nope"])
    assert code == 2 and "nope" in capsys.readouterr().err
    # --shipped-prior reaches the budget (and with it no prior is refitted, whatever the data)
    seen = {}

    def run(name, data, config, budget, strict=False, fresh_dir=None, seen_dirs=()):
        seen["b"] = budget
        return {}

    monkeypatch.setattr(protocol, "run", run)
    monkeypatch.setattr(protocol, "format_result", lambda r: "")
    for flags, refit in (([], True), (["--shipped-prior"], False)):
        seen.clear()
        assert cli.main(["evaluate", "--protocol", "lofo", "--data", str(synthetic_dir), *flags]) == 0
        assert seen["b"].refit_prior is refit
    capsys.readouterr()


def test_predict_answers_from_a_residual_descriptor_checkpoint(synthetic_dir, tmp_path):
    """A checkpoint with both options predicts a real (tiny) model end to end: its graphs carry no hardware,
    so the checkpoint's own descriptor prices the prior (the weights are trained on SYNTHETIC data: only the
    mechanism is checked, and that the answer scales with the prior)."""
    import gnn_ptp

    cfg = dataclasses.replace(TINY, model=dataclasses.replace(TINY.model, target="log_ratio_prior",
                                                              hardware_descriptor=True))
    train(cfg, synthetic_dir, tmp_path / "ckpt", log=lambda _: None)
    args = dict(batch_size=2, seq_len=16, hardware="cpu", checkpoint=tmp_path / "ckpt",
                overrides=["n_layer=1", "n_embd=32", "n_head=2", "vocab_size=100"], use_disk_cache=False)
    small = gnn_ptp.predict("hf:gpt2", precision="fp32", **args)
    large = gnn_ptp.predict("hf:gpt2", precision="fp32", **{**args, "batch_size": 64})
    assert small.source == "checkpoint" and 0 < small.compute_ms < large.compute_ms


def test_cli_trains_one_checkpoint_on_two_synthetic_cpu_folders_and_evaluates_each(two_cpus, tmp_path, capsys):
    from gnn_ptp.evaluate import evaluate

    config = tmp_path / "two.toml"
    config.write_text("epochs = 2\nthreads = 1\n[model]\nhidden = 16\ndepth = 1\ntarget = \"log_ratio_prior\"\n"
                      "hardware_descriptor = true\n")
    out = tmp_path / "ckpt"
    assert cli.main(["train", "--data", *map(str, two_cpus), "--config", str(config), "--out", str(out)]) == 0
    model, meta = checkpoint.load(out)
    for folder, name in zip(two_cpus, ("amd-epyc", "synthetic-slow-cpu")):
        r = evaluate(out, folder, split="all", log=lambda _: None)
        measured, samples, _ = protocol.load([folder])
        assert {s.hardware_name for s in samples} == {name}
        expected = predict_samples(model, samples)  # each sample with its own CPU's descriptor attached
        assert r["overall"]["mape"] == pytest.approx(
            metrics.ape(expected["pred_ms"][:, 3], expected["true_ms"][:, 3]).mean(), rel=1e-6)
    (tmp_path / "plain.toml").write_text("epochs = 1\n[model]\nhidden = 16\ndepth = 1\n")
    code = cli.main(["train", "--data", *map(str, two_cpus), "--config", str(tmp_path / "plain.toml"),
                     "--out", str(tmp_path / "ckpt2")])
    assert code == 2 and "needs [model] hardware_descriptor = true" in capsys.readouterr().err


def test_the_h200_protocol_config_is_the_shipped_h200_config_without_its_split():
    """The README's H200 protocol figures judge the config checkpoints/h200 is trained with."""
    import tomllib

    training = __import__("pathlib").Path(__file__).resolve().parent.parent / "training"
    shipped = tomllib.loads((training / "h200.toml").read_text())
    protocol_cfg = tomllib.loads((training / "protocol_h200.toml").read_text())
    assert shipped.pop("test_families") and shipped.pop("val_families")
    assert shipped == protocol_cfg


@pytest.mark.parametrize("flags, named", [(["--shipped-prior"], "--shipped-prior"),
                                          (["--epochs", "3", "--seeds", "0,1"], "--epochs, --seeds"),
                                          (["--no-depthwise-law"], "--no-depthwise-law"),
                                          (["--labels", "fastest"], "--labels"),
                                          (["--slow-conv-law", "bf16"], "--slow-conv-law"),
                                          (["--depthwise-floor"], "--depthwise-floor"),
                                          (["--attention-law"], "--attention-law"),
                                          (["--depthwise-paths"], "--depthwise-paths"),
                                          (["--fresh-data", "datasets/cpu"], "--fresh-data")])
def test_protocol_options_without_protocol_are_one_clear_error(flags, named, capsys):
    """Options only a --protocol run reads are refused on a checkpoint evaluation, not silently ignored."""
    code = cli.main(["evaluate", "--checkpoint", "checkpoints/cpu", "--data", "datasets/cpu", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{named}: only with --protocol lofo|size|hardware" in err


def test_a_config_with_node_weight_trains_its_folds_with_node_labels(synthetic_dir, monkeypatch):
    """The protocol attaches the node labels ``train`` would (a config with node_weight), so it scores what
    ``train`` ships; synthetic labels (every node its phase's equal share) stand in for profiles."""
    from gnn_ptp import node_labels

    def fake_load(data_dir, measured, log=None):
        out = {}
        for key, g in load_synthetic_graphs(data_dir, measured).items():
            n = int(g["x"].shape[0])
            out[key] = {"share": torch.full((n,), 0.1, dtype=torch.float64),
                        "mask": torch.ones(n, dtype=torch.bool), "matched_ms": 1.0, "total_ms": 1.0}
        return out

    monkeypatch.setattr(node_labels, "load", fake_load)
    _, samples, _ = protocol.load([synthetic_dir], node_labels=True, log=lambda _: None)
    assert samples and all(bool(s.node_mask.any()) for s in samples)
    _, plain, _ = protocol.load([synthetic_dir], log=lambda _: None)
    assert not any(hasattr(s, "node_mask") for s in plain)
    # through run(): the config's node_weight decides, and the result says how many were labelled
    labelled = dataclasses.replace(TINY, node_weight=1.0)
    budget = protocol.Budget(epochs=1, seeds=(0,), bootstrap=10, threads=1)
    r = protocol.run("size", synthetic_dir, labelled, budget, log=lambda _: None)
    assert r["node_labelled"] == len(samples)
    assert protocol.run("size", synthetic_dir, TINY, budget, log=lambda _: None)["node_labelled"] == 0


def test_transfer_prior_scores_pairs_only_from_kinds_with_their_own_fitted_section(two_cpus, capsys):
    """benchmarks/transfer_prior.py on two SYNTHETIC folders: the home kind's section was fitted to its own
    steps, the slow kind has none (its prior is the home kind's moved to it). The pair from the slow kind
    would move a moved prior again (an error before 2026-11-27, which stopped the script before its
    per-class table): it is left out and said so; the pair onto it is scored."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "transfer_prior.py"
    spec = importlib.util.spec_from_file_location("transfer_prior", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--data", *map(str, two_cpus)]) == 0
    out = capsys.readouterr().out
    slow = descriptor.slug(SLOW_CPU_MODEL)
    assert f"amd-epyc -> {slow}" in out and f"{slow} -> amd-epyc" not in out
    assert "NOT its own steps: no pair from it is scored" in out
    assert "MAPE per precision class" in out


def test_fastest_labels_reach_the_folds_and_the_noise_floor_follows(synthetic_dir):
    """Three more SYNTHETIC passes of every configuration, 1.2x, 1.5x and 1.3x slower (a host slowed by
    interference): ``labels="fastest"`` scores against the first pass's times, ``mean`` against the four
    passes' mean, and the noise floor is the split-half one (``noise.FastestFloor``), not the Gaussian one."""
    from gnn_ptp import noise

    first = [json.loads(line) for line in (synthetic_dir / "synthetic.jsonl").read_text().splitlines()]
    truth = {r["key"]: r["timing"]["step_ms"]["median"] for r in first}
    for i, factor in enumerate((1.2, 1.5, 1.3)):
        for r in first:
            slower = {**r, "timing": {k: {**v, "median": v["median"] * factor} for k, v in r["timing"].items()}}
            records.append_record(slower, synthetic_dir, f"pass-{i + 2}.jsonl")
    budget = dataclasses.replace(BUDGET, seeds=(0,), families=(FAMILIES[0],), variants=("gnn",), bootstrap=10)
    got = {}
    for label in ("fastest", "mean"):
        r = protocol.run("lofo", synthetic_dir, TINY, dataclasses.replace(budget, labels=label), log=lambda _: None)
        (fold,) = r["folds"]
        got[label] = dict(zip(fold["keys"], fold["true_ms"]))
        assert r["budget"]["labels"] == label
        _, _, repeats = protocol.load([synthetic_dir])
        assert r["noise_floor"] == pytest.approx(noise.floor_for(label, repeats).floor(
            [k for k in repeats if k[1] in got[label]]))
    for key, ms in got["fastest"].items():
        assert ms == pytest.approx(truth[key], rel=1e-3)
        assert got["mean"][key] == pytest.approx(truth[key] * 5.0 / 4, rel=1e-3)
    with pytest.raises(UserError, match="protocol labels 'min': allowed: mean, fastest"):
        protocol.Budget(labels="min")
    # no labels named: the training config's (what ``train`` with it would ship), an explicit choice wins
    fastest_cfg = dataclasses.replace(TINY, labels="fastest")
    unset = dataclasses.replace(budget, labels=None)
    r = protocol.run("lofo", synthetic_dir, fastest_cfg, unset, log=lambda _: None)
    assert r["budget"]["labels"] == "fastest" and dict(zip(r["folds"][0]["keys"], r["folds"][0]["true_ms"])) == got["fastest"]
    r = protocol.run("lofo", synthetic_dir, TINY, unset, log=lambda _: None)
    assert r["budget"]["labels"] == "mean"
    r = protocol.run("lofo", synthetic_dir, fastest_cfg, dataclasses.replace(budget, labels="mean"), log=lambda _: None)
    assert r["budget"]["labels"] == "mean"


def test_the_slow_conv_law_joins_a_cpu_kinds_section_options_and_not_a_gpus(monkeypatch):
    """``--slow-conv-law bf16`` adds the dtype to the law a CPU kind's refit takes from its shipped section
    (here one carrying fp32's), leaves a GPU's options alone, and an unknown dtype is one clear error
    (SYNTHETIC folders: the records, descriptors and sections are stubbed)."""
    from types import SimpleNamespace

    from gnn_ptp import dataset, descriptor, node_labels, prior

    kinds = {"cpu-dir": ("cpu-x", "cpu"), "gpu-dir": ("h200", "gpu")}
    monkeypatch.setattr(dataset, "measured_configs",
                        lambda d, strict=False: [SimpleNamespace(env={"dir": d}, hardware=kinds[d][0])])
    monkeypatch.setattr(descriptor, "for_env", lambda env: SimpleNamespace(
        name=kinds[env["dir"]][0], kind=kinds[env["dir"]][1], curves_section=lambda: kinds[env["dir"]][0]))
    monkeypatch.setattr(node_labels, "profiled_ids", lambda d: [1])
    asked = {}
    monkeypatch.setattr(node_labels, "node_seconds", lambda d, measured, profiler_cost=False: asked.update(
        {d: profiler_cost}) or {})
    monkeypatch.setattr(prior, "calibration", lambda: {"cpu-x": {"slow_conv": {"backward:fp32": [1.0]}},
                                                       "h200": {"channel_ramp": {"batch_norm": [1.0, 1.0]}}})
    said = []
    refit = protocol.prior_refit(["cpu-dir", "gpu-dir"], said.append, as_shipped=True, slow_conv_law=("bf16",))
    assert refit.options["cpu-x"]["slow_conv"] == ("bf16", "fp32")
    assert refit.options["h200"]["slow_conv"] == () and refit.options["h200"]["channel_ramp"]
    assert any("bf16, fp32 priced by the additive shape law" in line for line in said)
    plain = protocol.prior_refit(["cpu-dir"], said.append, as_shipped=True)
    assert plain.options["cpu-x"]["slow_conv"] == ("fp32",)
    assert not plain.options["cpu-x"]["profiler_cost"] and asked == {"cpu-dir": False, "gpu-dir": False}
    # --profiler-cost joins a CPU kind's options (its node seconds are read less the cost), not a GPU's
    refit = protocol.prior_refit(["cpu-dir", "gpu-dir"], said.append, as_shipped=True, profiler_cost=True)
    assert refit.options["cpu-x"]["profiler_cost"] and not refit.options["h200"]["profiler_cost"]
    assert asked == {"cpu-dir": True, "gpu-dir": False}
    # --depthwise-floor joins a CPU kind's options, not a GPU's
    refit = protocol.prior_refit(["cpu-dir", "gpu-dir"], said.append, as_shipped=True, depthwise_floor=True)
    assert refit.options["cpu-x"]["depthwise_floor"] and not refit.options["h200"]["depthwise_floor"]
    assert any("never prices a kernel faster than its fastest fitted one" in line for line in said)
    assert not plain.options["cpu-x"]["depthwise_floor"]
    # --attention-law joins a CPU kind's options, not a GPU's
    refit = protocol.prior_refit(["cpu-dir", "gpu-dir"], said.append, as_shipped=True, attention_law=True)
    assert refit.options["cpu-x"]["attention_law"] and not refit.options["h200"]["attention_law"]
    assert any("fused attention priced by the costs of its kernel's loops" in line for line in said)
    assert not plain.options["cpu-x"]["attention_law"]
    refit = protocol.prior_refit(["cpu-dir", "gpu-dir"], said.append, as_shipped=True, depthwise_paths=True)
    assert refit.options["cpu-x"]["depthwise_paths"] and not refit.options["h200"]["depthwise_paths"]
    assert any("depthwise convolutions priced by a law per kernel path" in line for line in said)
    # --conv-blocks joins a CPU kind's options (its dense convolutions' law gets the channel-block costs), not a GPU's
    refit = protocol.prior_refit(["cpu-dir", "gpu-dir"], said.append, as_shipped=True, conv_blocks=True)
    assert refit.options["cpu-x"]["conv_blocks"] and not refit.options["h200"]["conv_blocks"]
    assert refit.options["cpu-x"]["slow_conv"] == ("fp32",)  # the section's law, now with the costs
    assert any("per multiply-add of channels not in whole blocks" in line for line in said)
    assert not plain.options["cpu-x"]["conv_blocks"]
    # --matmul-cap joins a CPU kind's options (its matmul curves held at their fastest fitted fraction), not a GPU's
    refit = protocol.prior_refit(["cpu-dir", "gpu-dir"], said.append, as_shipped=True, matmul_cap=True)
    assert refit.options["cpu-x"]["matmul_cap"] and not refit.options["h200"]["matmul_cap"]
    assert any("each matmul curve held at the fastest fraction" in line for line in said)
    assert not plain.options["cpu-x"]["matmul_cap"]
    with pytest.raises(UserError, match="protocol slow_conv_law dtype 'bf61': allowed: fp32, bf16; did you mean 'bf16'"):
        protocol.Budget(slow_conv_law=("bf61",))


def test_size_prior_passes_its_form_options_to_the_refit(monkeypatch):
    """benchmarks/size_prior.py's --conv-blocks, --attention-law, --matmul-cap and --slow-conv-law reach
    ``protocol.prior_refit`` (on top of the section's options, as ``evaluate --protocol size`` passes them), each
    only when given."""
    import sys

    from conftest import benchmark_module

    module = benchmark_module("size_prior")
    asked = []

    def refit(data_dirs, log, **kw):  # no profiles: price_sets stops with its one line, after the call
        asked.append(kw)
        return None

    monkeypatch.setattr(module.protocol, "prior_refit", refit)
    off = {"conv_blocks": False, "attention_law": False, "matmul_cap": False, "slow_conv_law": ()}
    for argv, want in ((["--attention-law"], {**off, "attention_law": True}),
                       (["--conv-blocks"], {**off, "conv_blocks": True}),
                       (["--matmul-cap"], {**off, "matmul_cap": True}),
                       (["--slow-conv-law", "fp32"], {**off, "slow_conv_law": ("fp32",)}),
                       ([], off)):
        monkeypatch.setattr(sys, "argv", ["size_prior.py", "--data", "datasets/cpu", *argv])
        with pytest.raises(UserError, match="no per-op profiles"):
            module.main()
        assert asked[-1] == {"as_shipped": True, **want}
