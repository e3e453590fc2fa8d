"""The factor for larger steps (``TrainConfig.scale_beyond_range``, ``StepTimeGNN.beyond_scale``): how it
moves with a step's FLOPs, how training chooses it on an inner size split, what the checkpoint records and
restores, the protocol's row, and what refuses. On the SYNTHETIC dataset (made-up graphs and times,
synthetic_data.py) with tiny models: only the mechanism is tested, no figure of a real machine."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from gnn_ptp import checkpoint, dataset, descriptor, metrics, protocol, train as train_mod
from gnn_ptp.errors import UserError
from gnn_ptp.model import BEYOND_FACTOR, ModelConfig, StepTimeGNN, log_total
from gnn_ptp.train import TrainConfig, predict_samples, train

from synthetic_data import FAMILIES, load_synthetic_graphs, write_synthetic_dataset

RESIDUAL = TrainConfig(model=ModelConfig(hidden=16, depth=1, target="log_ratio_prior", hardware_descriptor=True),
                       epochs=2, threads=1, test_families=(FAMILIES[0],), scale_on_validation=True,
                       scale_beyond_range=True)


@pytest.fixture
def synthetic_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)
    monkeypatch.setattr(train_mod, "MIN_BEYOND_CHECK", 2)  # 24 made-up steps span a narrow range
    return write_synthetic_dataset(tmp_path / "synthetic-cpu")


def _samples(folder):
    measured = dataset.measured_configs(folder)
    samples = dataset.make_samples(measured, dataset.load_graphs(folder, measured))
    descriptor.attach_measured(samples, measured)
    return samples


def _step(model, sample) -> float:
    with torch.no_grad():
        from torch_geometric.data import Batch

        return float(log_total(model(Batch.from_data_list([sample]))["log_phase_ms"])[0])


def test_the_factor_moves_from_the_in_range_one_to_the_larger_steps_one_in_log_flops(synthetic_dir):
    from torch_geometric.data import Batch

    samples = _samples(synthetic_dir)[:6]
    torch.manual_seed(0)
    model = StepTimeGNN(ModelConfig(hidden=16, depth=1, target="log_ratio_prior", hardware_descriptor=True)).eval()
    model.time_offset.fill_(0.4)  # a correction far from nothing
    flops = np.array([protocol.step_flops(s) for s in samples])
    assert (flops > 1).sum() >= 3, "the made-up steps' FLOPs"
    big = [s for s, f in zip(samples, flops) if f > 1]
    top = float(min(protocol.step_flops(s) for s in big))
    model.correction_scale, model.beyond_scale, model.train_max_flops = 0.75, 0.0, top
    batch = Batch.from_data_list(big)
    factor = model.factors(batch)
    expect = [0.75 - 0.75 * min(1.0, max(0.0, math.log(protocol.step_flops(s) / top) / math.log(BEYOND_FACTOR)))
              for s in big]
    assert factor.tolist() == pytest.approx(expect, abs=1e-6)
    assert factor.min() < factor.max()  # steps at different distances get different factors
    # each graph answers as the same model with its own factor as one number: batching does not mix them
    with torch.no_grad():
        together = log_total(model(batch)["log_phase_ms"])
    alone = []
    for s, f in zip(big, expect):
        single = StepTimeGNN(model.cfg).eval()
        single.load_state_dict(model.state_dict())
        single.correction_scale = f
        alone.append(_step(single, s))
    assert together.tolist() == pytest.approx(alone, abs=1e-5)
    # at and below the largest training step: the in-range factor; without a factor for larger steps: unchanged
    model.train_max_flops = float(flops.max()) * 10
    assert model.factors(batch).tolist() == pytest.approx([0.75] * len(big))
    model.beyond_scale = None
    assert model.factors(batch) == 0.75


def test_the_inner_split_is_the_smaller_half_and_the_steps_twice_its_largest(synthetic_dir, monkeypatch):
    samples = _samples(synthetic_dir)
    half, check = train_mod.inner_size_split(samples)
    flops = sorted(protocol.step_flops(s) for s in samples)
    assert [protocol.step_flops(s) for s in half] == flops[:len(flops) // 2]
    assert [protocol.step_flops(s) for s in check] == [f for f in flops if f >= BEYOND_FACTOR * flops[len(flops) // 2 - 1]]
    monkeypatch.setattr(train_mod, "MIN_BEYOND_CHECK", len(check) + 1)
    with pytest.raises(UserError, match=f"needs {len(check) + 1} training steps or more with 2x the FLOPs of the "
                                        f"smaller half's largest; these 24 have {len(check)}"):
        train_mod.inner_size_split(samples)


def test_training_chooses_the_factor_on_the_inner_split_and_the_checkpoint_answers_with_it(synthetic_dir, tmp_path):
    run = train(RESIDUAL, synthetic_dir, tmp_path / "ckpt", log=lambda _: None)
    beyond = run["beyond_scale"]
    mapes = {float(k): v for k, v in beyond["check_mape"].items()}
    assert beyond["chosen"] == min(mapes, key=lambda k: (mapes[k], k))
    assert set(mapes) == set(train_mod.CORRECTION_SCALES)
    train_part = [s for s in _samples(synthetic_dir) if run["split"][s.family] == "train"]
    assert beyond["train_max_flops"] == pytest.approx(max(protocol.step_flops(s) for s in train_part))
    assert beyond["n_inner_train"] == len(train_part) // 2 and beyond["n_check"] >= 2
    # the inner model's check figures are those of a model trained on the smaller half alone
    half, check = train_mod.inner_size_split(train_part)
    val = [s for s in _samples(synthetic_dir) if run["split"][s.family] == "val"]
    inner_cfg = dataclasses.replace(RESIDUAL, scale_on_validation=False, scale_beyond_range=False)
    inner = train(inner_cfg, None, None, log=lambda _: None,
                  prepared=(dataset.measured_configs(synthetic_dir), half + val, {}, {"train": half, "val": val, "test": []}))["model"]
    assert train_mod.mape_by_scale(inner, check) == pytest.approx(mapes)
    model, meta = checkpoint.load(tmp_path / "ckpt")
    assert meta["beyond_scale"]["chosen"] == beyond["chosen"]
    assert (model.beyond_scale, model.train_max_flops) == (beyond["chosen"], pytest.approx(beyond["train_max_flops"]))
    samples = _samples(synthetic_dir)
    assert predict_samples(model, samples)["pred_ms"] == pytest.approx(
        predict_samples(run["model"], samples)["pred_ms"], rel=1e-5)
    assert checkpoint.beyond_note(meta).startswith("beyond its largest training step its correction's factor "
                                                   f"moves to {beyond['chosen']:g}")
    from gnn_ptp.evaluate import evaluate, format_table

    table = format_table(evaluate(tmp_path / "ckpt", synthetic_dir, log=lambda _: None))
    assert f"gnn: {checkpoint.beyond_note(meta)}" in table
    # a damaged record is refused in one line
    meta["beyond_scale"]["chosen"] = 2
    (tmp_path / "ckpt" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="beyond_scale .* needs a factor between 0 and 1"):
        checkpoint.load(tmp_path / "ckpt")


def test_each_ensemble_member_chooses_its_own_factor_for_larger_steps(synthetic_dir, tmp_path):
    cfg = dataclasses.replace(RESIDUAL, ensemble_seeds=(0, 1))
    run = train(cfg, synthetic_dir, tmp_path / "ens", log=lambda _: None)
    model, meta = checkpoint.load(tmp_path / "ens")
    members = meta["ensemble"]["members"]
    assert all("beyond_scale" in m for m in members)
    assert [(m.beyond_scale, m.train_max_flops) for m in model.members] == [
        (r["beyond_scale"]["chosen"], pytest.approx(r["beyond_scale"]["train_max_flops"])) for r in members]
    assert "beyond its largest training step its correction's factor moves to " in checkpoint.beyond_note(meta)
    assert checkpoint.beyond_note({"model": {}}) == ""
    samples = _samples(synthetic_dir)
    assert predict_samples(model, samples)["pred_ms"] == pytest.approx(
        predict_samples(run["model"], samples)["pred_ms"], rel=1e-5)


@pytest.mark.parametrize("bad, message", [
    ({"scale_beyond_range": "yes"}, "scale_beyond_range = 'yes' must be true or false"),
    ({"model": ModelConfig(hidden=16, depth=1), "scale_on_validation": False}, "scale_beyond_range = true scales a correction to the physical prior"),
])
def test_scale_beyond_range_is_checked(bad, message):
    with pytest.raises(UserError, match=message):
        dataclasses.replace(RESIDUAL, **bad)


def test_the_size_protocol_scores_the_factor_for_larger_steps_last_and_leaves_the_other_rows(synthetic_dir,
                                                                                               monkeypatch):
    monkeypatch.setattr(protocol, "SIZE_FACTOR", BEYOND_FACTOR)  # every test step gets the whole factor
    base = TrainConfig(model=ModelConfig(hidden=16, depth=1, target="log_ratio_prior", hardware_descriptor=True),
                       epochs=2, threads=1)  # the gnn-prior variant's model: a config the option can name
    budget = protocol.Budget(epochs=2, seeds=(0, 1), bootstrap=100, threads=1, variants=("gnn-prior",))
    without = protocol.run("size", synthetic_dir, base, budget, log=lambda _: None)
    monkeypatch.setattr(train_mod, "MIN_BEYOND_CHECK", 1)  # the size split's smaller half: a dozen made-up steps
    r = protocol.run("size", synthetic_dir, dataclasses.replace(base, scale_beyond_range=True), budget,
                     log=lambda _: None)
    names = list(r["predictors"])
    assert names[-2:] == [protocol.BEYOND, protocol.BEYOND_ENSEMBLE]
    assert names[:-2] == list(without["predictors"])
    for p, sc in without["predictors"].items():  # the other rows, their intervals too, as without it
        assert r["predictors"][p]["mape"] == pytest.approx(sc["mape"]) and r["predictors"][p]["ci95"] == sc["ci95"]
    for fold in r["folds"]:  # every test step is beyond the range: the scaled model at the chosen factor
        factor = fold[protocol.BEYOND]["chosen"]
        prior, residual = np.array(fold["pred_ms"]["prior"]), np.array(fold["pred_ms"]["gnn-prior"])
        assert fold["test_min_flops"] >= BEYOND_FACTOR * fold[protocol.BEYOND]["train_max_flops"]
        if factor == fold[protocol.SCALED]["correction_scale"]:
            assert fold["pred_ms"][protocol.BEYOND] == pytest.approx(fold["pred_ms"][protocol.SCALED], rel=1e-3)
        if factor == 0:
            assert np.all(np.abs(np.array(fold["pred_ms"][protocol.BEYOND]) / prior - 1) < 2e-3)
        if factor == 1:
            assert fold["pred_ms"][protocol.BEYOND] == pytest.approx(list(residual), rel=1e-3)
    a, b = r["folds"]
    geo = np.sqrt(np.array(a["pred_ms"][protocol.BEYOND]) * np.array(b["pred_ms"][protocol.BEYOND]))
    assert r["predictors"][protocol.BEYOND_ENSEMBLE]["mape"] == pytest.approx(
        metrics.ape(geo, np.array(a["true_ms"])).mean())
    assert f"{protocol.BEYOND}: the factor for larger steps chosen on each fold's inner size split" in \
        protocol.format_result(r)


def test_predict_says_how_far_beyond_the_largest_training_step_a_step_is_and_what_factor_answers():
    from gnn_ptp.prediction import _beyond_step_note

    x = torch.zeros(3, 4)
    x[:, 0] = math.log2(1 + 1e9)  # three nodes of 1 GFLOP: a 3 GFLOP step
    one = {"beyond_scale": {"chosen": 0.25, "train_max_flops": 1e9}}
    note = _beyond_step_note(one, {"x": x})
    assert note.startswith("this step has 3x the FLOPs of the checkpoint's largest training step: beyond its "
                           "largest training step its correction's factor moves to 0.25")
    assert note.endswith("for this step the move is 100% complete")
    half = _beyond_step_note({"beyond_scale": {"chosen": 0.25, "train_max_flops": 3e9 / math.sqrt(2)}}, {"x": x})
    assert "1.41x the FLOPs" in half and half.endswith("for this step the move is 50% complete")
    assert _beyond_step_note({"beyond_scale": {"chosen": 0.25, "train_max_flops": 4e9}}, {"x": x}) is None
    assert _beyond_step_note({}, {"x": x}) is None  # no factor for larger steps: no note
    ensemble = {"ensemble": {"members": [{"beyond_scale": {"chosen": 0.0, "train_max_flops": 2e9}},
                                         {"beyond_scale": {"chosen": 0.5, "train_max_flops": 1e9}}]}}
    note = _beyond_step_note(ensemble, {"x": x})
    assert "moves to 0, 0.5" in note and note.endswith("for the member with the smallest training range")
