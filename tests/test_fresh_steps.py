"""Fresh larger steps for the size protocol (``evaluate --protocol size --fresh-data``) and a factor for larger
steps fixed in a training config (``TrainConfig.beyond_scale``). On the SYNTHETIC dataset (made-up graphs and
times, synthetic_data.py) with tiny models: only the mechanism is tested, no figure of a real machine."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from gnn_ptp import checkpoint, dataset, descriptor, metrics, protocol
from gnn_ptp.errors import UserError
from gnn_ptp.model import BEYOND_FACTOR, ModelConfig
from gnn_ptp.train import TrainConfig, predict_samples, train

from synthetic_data import CONFIGS_PER_FAMILY, FAMILIES, load_synthetic_graphs, write_synthetic_dataset

RESIDUAL = TrainConfig(model=ModelConfig(hidden=16, depth=1, target="log_ratio_prior", hardware_descriptor=True),
                       epochs=2, threads=1)
BUDGET = protocol.Budget(epochs=2, seeds=(0, 1), bootstrap=100, threads=1, variants=("gnn-prior",))


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """The synthetic dataset and a folder of other made-up configurations of the same kind (none of its keys)."""
    monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)
    data = write_synthetic_dataset(tmp_path / "synthetic-cpu")
    fresh = write_synthetic_dataset(tmp_path / "fresh", per_family=3, start=CONFIGS_PER_FAMILY)
    return data, fresh


def _samples(folder):
    measured = dataset.measured_configs(folder)
    samples = dataset.make_samples(measured, dataset.load_graphs(folder, measured))
    descriptor.attach_measured(samples, measured)
    return samples


def test_fresh_steps_are_priced_by_each_fold_s_models_and_scored_apart_without_moving_any_other_figure(
        folders, monkeypatch):
    data, fresh = folders
    monkeypatch.setattr(protocol, "SIZE_FACTOR", 1.5)  # 24 made-up steps span a narrow range
    without = protocol.run("size", data, RESIDUAL, BUDGET, log=lambda _: None)
    r = protocol.run("size", data, RESIDUAL, BUDGET, log=lambda _: None, fresh_dir=fresh)
    assert list(r["predictors"]) == list(without["predictors"])
    for p, sc in without["predictors"].items():  # every figure on --data's own test steps, intervals too
        assert r["predictors"][p]["mape"] == pytest.approx(sc["mape"]) and r["predictors"][p]["ci95"] == sc["ci95"]
    assert [f["keys"] for f in r["folds"]] == [f["keys"] for f in without["folds"]]
    theirs = {s.key: protocol.step_flops(s) for s in _samples(fresh)}
    for fold in r["folds"]:
        tested = fold["fresh"]
        expect = sorted(k for k, f in theirs.items() if f >= 1.5 * fold["train_max_flops"])
        assert sorted(tested["keys"]) == expect and tested["n_test"] == len(expect) >= 1
        assert tested["test_min_flops"] >= 1.5 * fold["train_max_flops"]
        assert set(tested["pred_ms"]) == set(fold["pred_ms"])
    fresh_rows = r["fresh"]["predictors"]
    assert set(fresh_rows) == set(r["predictors"])
    a, b = r["folds"]
    true = np.array(a["fresh"]["true_ms"])
    for row in ("prior", "ridge", "gnn-prior", protocol.SCALED):  # each seed's row, from the stored predictions
        per_seed = [metrics.ape(np.array(f["fresh"]["pred_ms"][row]), true).mean() for f in (a, b)]
        assert fresh_rows[row]["mape"] == pytest.approx(np.mean(per_seed), rel=1e-6)
    geo = np.sqrt(np.array(a["fresh"]["pred_ms"][protocol.SCALED]) * np.array(b["fresh"]["pred_ms"][protocol.SCALED]))
    assert fresh_rows[protocol.SCALED_ENSEMBLE]["mape"] == pytest.approx(metrics.ape(geo, true).mean(), rel=1e-6)
    assert r["fresh"]["n_configurations"] == len(theirs) and r["fresh"]["data"] == str(fresh)
    text = protocol.format_result(r)
    assert f"fresh steps ({fresh}): {a['fresh']['n_test']} of its {len(theirs)} configurations" in text
    json.dumps(r)  # --json prints it


def test_configurations_also_in_the_data_are_not_fresh_and_left_out_said_so(folders, tmp_path, monkeypatch):
    data, fresh = folders
    monkeypatch.setattr(protocol, "SIZE_FACTOR", 1.5)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    lines = (data / "synthetic.jsonl").read_text().splitlines()[:2] + (fresh / "synthetic.jsonl").read_text().splitlines()
    (mixed / "synthetic.jsonl").write_text("\n".join(lines) + "\n")
    said = []
    r = protocol.run("size", data, RESIDUAL, BUDGET, log=said.append, fresh_dir=mixed)
    new = protocol.run("size", data, RESIDUAL, BUDGET, log=lambda _: None, fresh_dir=fresh)
    assert r["fresh"]["left_out_in_data"] == sorted(json.loads(x)["key"] for x in lines[:2])
    assert r["fresh"]["n_configurations"] == new["fresh"]["n_configurations"] == len(lines) - 2
    assert r["fresh"]["predictors"] == new["fresh"]["predictors"]  # as if the folder held the new ones alone
    assert any("2 of its" in m and "are also in --data" in m and "not fresh, left out" in m for m in said)


def test_configurations_in_a_seen_folder_are_left_out_apart_and_said_so(folders, tmp_path, monkeypatch, capsys):
    """``--seen-data``: a fresh configuration also measured in an earlier fresh set (one forms were chosen on) is
    left out of the fresh scores as one in --data is, and listed apart."""
    from gnn_ptp import cli

    data, fresh = folders
    monkeypatch.setattr(protocol, "SIZE_FACTOR", 1.5)
    lines = (fresh / "synthetic.jsonl").read_text().splitlines()
    seen = tmp_path / "seen"
    seen.mkdir()
    (seen / "synthetic.jsonl").write_text("\n".join(lines[:3]) + "\n")  # an earlier set holding three of them
    rest = tmp_path / "rest"
    rest.mkdir()
    (rest / "synthetic.jsonl").write_text("\n".join(lines[3:]) + "\n")
    said = []
    r = protocol.run("size", data, RESIDUAL, BUDGET, log=said.append, fresh_dir=fresh, seen_dirs=(seen,))
    alone = protocol.run("size", data, RESIDUAL, BUDGET, log=lambda _: None, fresh_dir=rest)
    keys = sorted(json.loads(x)["key"] for x in lines[:3])
    assert r["fresh"]["left_out_as_seen"] == keys and r["fresh"]["left_out_in_data"] == []
    assert r["fresh"]["seen_data"] == [str(seen)]
    assert r["fresh"]["n_configurations"] == alone["fresh"]["n_configurations"] == len(lines) - 3
    assert r["fresh"]["predictors"] == alone["fresh"]["predictors"]  # as if the three were never there
    assert any("3 of its" in m and "are also in --seen-data" in m and "not fresh, left out" in m for m in said)
    with pytest.raises(UserError, match="all .* configurations are also in --data or --seen-data"):
        protocol.run("size", data, RESIDUAL, BUDGET, log=lambda _: None, fresh_dir=seen, seen_dirs=(fresh,))
    code = cli.main(["evaluate", "--protocol", "size", "--data", str(data), "--seen-data", str(seen)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == ("gnn-ptp evaluate: error: --seen-data: only with --fresh-data (it leaves "
                                 "configurations out of the fresh set)")


def test_fresh_steps_that_are_not_new_or_not_a_size_run_are_refused_in_one_line(folders, monkeypatch):
    data, fresh = folders
    monkeypatch.setattr(protocol, "SIZE_FACTOR", 1.5)
    with pytest.raises(UserError, match=r"--fresh-data .*: all 24 of its configurations are also in --data"):
        protocol.run("size", data, RESIDUAL, BUDGET, log=lambda _: None, fresh_dir=data)
    with pytest.raises(UserError, match="--fresh-data: only with --protocol size"):
        protocol.run("lofo", data, RESIDUAL, BUDGET, log=lambda _: None, fresh_dir=fresh)
    monkeypatch.setattr(protocol, "SIZE_FACTOR", 1e-9)  # every fresh step is tested...
    monkeypatch.setattr(protocol, "fresh_tests", lambda samples, top: [])  # ...unless none reaches the factor
    with pytest.raises(UserError, match="no configuration there has .* it tests nothing"):
        protocol.run("size", data, RESIDUAL, BUDGET, log=lambda _: None, fresh_dir=fresh)


def test_a_fixed_factor_for_larger_steps_is_trained_with_recorded_and_fades_the_correction(folders, tmp_path):
    data, fresh = folders
    cfg = dataclasses.replace(RESIDUAL, test_families=(FAMILIES[0],), beyond_scale=0.0)
    run = train(cfg, data, tmp_path / "ckpt", log=lambda _: None)
    beyond = run["beyond_scale"]
    train_part = [s for s in _samples(data) if run["split"][s.family] == "train"]
    assert beyond == {"chosen": 0.0, "chosen_by": "config",
                      "train_max_flops": pytest.approx(max(protocol.step_flops(s) for s in train_part))}
    model, meta = checkpoint.load(tmp_path / "ckpt")
    assert (model.beyond_scale, model.train_max_flops) == (0.0, pytest.approx(beyond["train_max_flops"]))
    assert checkpoint.beyond_note(meta).endswith("fixed by its training config (the prior alone there)")
    # a step with twice the training maximum's FLOPs or more is priced by the prior alone, one within it as without
    # the factor (the made-up steps span less than 2x: the recorded maximum is moved to put them on either side;
    # ``model.beyond_reach`` counts FLOPs from 1)
    steps = _samples(data) + _samples(fresh)
    flops = np.array([protocol.step_flops(s) for s in steps])
    far = [s for s, f in zip(steps, flops) if f >= BEYOND_FACTOR]
    assert len(far) >= 3, "the made-up steps' FLOPs"
    prior = np.array([float(s.prior_log_ms.double().exp().sum()) for s in far])
    unfaded = checkpoint.load(tmp_path / "ckpt")[0]
    unfaded.beyond_scale = None
    as_learnt = predict_samples(unfaded, steps)["pred_ms"][:, 3]
    assert predict_samples(unfaded, far)["pred_ms"][:, 3] != pytest.approx(prior, rel=2e-3)  # a correction to fade
    model.train_max_flops = 1.0
    assert predict_samples(model, far)["pred_ms"][:, 3] == pytest.approx(prior, rel=2e-3)
    model.train_max_flops = float(flops.max())
    assert predict_samples(model, steps)["pred_ms"][:, 3] == pytest.approx(as_learnt, rel=1e-5)


@pytest.mark.parametrize("bad, message", [
    ({"beyond_scale": 2}, "beyond_scale = 2 must be a number from 0"),
    ({"beyond_scale": True}, "beyond_scale = True must be a number from 0"),
    ({"beyond_scale": "0"}, "beyond_scale = '0' must be a number from 0"),
    ({"beyond_scale": 0.0, "scale_beyond_range": True}, "beyond_scale = 0.0 and scale_beyond_range = true both"),
    ({"beyond_scale": 0.0, "model": ModelConfig(hidden=16, depth=1)}, "beyond_scale scales a correction to the "
                                                                      "physical prior"),
])
def test_beyond_scale_is_checked(bad, message):
    with pytest.raises(UserError, match=message):
        dataclasses.replace(RESIDUAL, **bad)


def test_the_fresh_steps_benchmark_reads_each_member_s_training_range_as_training_records_it(folders, tmp_path,
                                                                                             capsys):
    """benchmarks/fresh_steps.py fades a shipped checkpoint without retraining it: each member's largest training
    step, read back from the training folder, is the one ``train`` records with a fixed factor for larger steps."""
    from conftest import benchmark_module

    data, fresh = folders
    cfg = dataclasses.replace(RESIDUAL, test_families=(FAMILIES[0],), ensemble_seeds=(0, 1), beyond_scale=0.0)
    train(cfg, data, tmp_path / "ens", log=lambda _: None)
    model, meta = checkpoint.load(tmp_path / "ens")
    bench = benchmark_module("fresh_steps")
    tops = bench.training_maxima(meta, _samples(data))
    assert tops == pytest.approx([m["beyond_scale"]["train_max_flops"] for m in meta["ensemble"]["members"]])
    assert bench.main(["--checkpoint", str(tmp_path / "ens"), "--data", str(data), "--fresh", str(fresh)]) == 0
    out = capsys.readouterr().out
    assert f"on {fresh}: {len(_samples(fresh))} configurations" in out
    for row in ("as it answers", "faded beyond the range", "the prior alone", "member 1 as it answers"):
        assert row in out


def test_the_size_protocol_with_a_fixed_factor_scores_it_as_its_beyond_row(folders, monkeypatch):
    """A protocol config with ``beyond_scale`` trains its residual variant with it (the log-time variant has no
    correction to fade) and scores it as the factor-for-larger-steps row, said to be the config's."""
    data, _ = folders
    monkeypatch.setattr(protocol, "SIZE_FACTOR", 1.5)
    budget = dataclasses.replace(BUDGET, variants=("gnn", "gnn-prior"))
    r = protocol.run("size", data, dataclasses.replace(RESIDUAL, beyond_scale=0.0), budget, log=lambda _: None)
    assert list(r["predictors"])[-2:] == [protocol.BEYOND, protocol.BEYOND_ENSEMBLE]
    for fold in r["folds"]:  # the model's largest training step: the smaller half's, less the validation draw
        beyond = fold[protocol.BEYOND]
        assert (beyond["chosen"], beyond["chosen_by"]) == (0.0, "config")
        assert 0 < beyond["train_max_flops"] <= fold["train_max_flops"]
    assert f"{protocol.BEYOND}: the factor for larger steps fixed by the training config: 0 in 2 of 2 folds" in \
        protocol.format_result(r)
