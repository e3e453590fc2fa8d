"""``gnn-ptp train`` (gnn_ptp/train.py, dataset.family_split, checkpoint.py) on the SYNTHETIC dataset
(made-up graphs and times, see synthetic_data.py): family hold-out, seeding, early stopping, the
checkpoint round trip, the TOML config and diverged runs."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from gnn_ptp import checkpoint, cli, dataset, train as train_mod
from gnn_ptp.errors import UserError
from gnn_ptp.graph import GRAPH_FEATURES, feature_version
from gnn_ptp.model import ModelConfig
from gnn_ptp.train import TrainConfig, TrainingDiverged, load_train_config, predict_samples, prepare, train

from synthetic_data import FAMILIES, load_synthetic_graphs, write_synthetic_dataset

SMALL = TrainConfig(model=ModelConfig(hidden=16, depth=1), epochs=3, threads=1)
META_KEYS = {"model", "train", "feature_version", "hardware", "data_hash", "split", "metrics", "train_ranges"}


@pytest.fixture
def synthetic_dir(tmp_path, monkeypatch):
    """A SYNTHETIC dataset folder; its graphs are made up from the record keys instead of traced."""
    monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)
    return write_synthetic_dataset(tmp_path / "synthetic-cpu")


def _quiet(lines=None):
    return (lines.append if lines is not None else (lambda msg: None))


def _samples(data_dir):
    measured = dataset.measured_configs(data_dir)
    return dataset.make_samples(measured, dataset.load_graphs(data_dir, measured))


def _predict_all(model, samples) -> dict[str, torch.Tensor]:
    from torch_geometric.data import Batch

    model.eval()
    with torch.no_grad():
        return model(Batch.from_data_list(samples))


# --- family hold-out --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_whole_families_are_held_out(synthetic_dir, seed):
    _, samples, split, parts = prepare(synthetic_dir, dataclasses.replace(SMALL, seed=seed), _quiet())
    assert set(split) == set(FAMILIES) and set(split.values()) == {"train", "val", "test"}
    families = {name: {s.family for s in part} for name, part in parts.items()}
    assert not families["train"] & families["val"]
    assert not families["train"] & families["test"]
    assert not families["val"] & families["test"]
    assert sum(len(p) for p in parts.values()) == len(samples) == len(FAMILIES) * 4  # nobody dropped
    for name, part in parts.items():
        assert all(split[s.family] == name for s in part)


def test_split_is_reproducible_from_the_seed_and_changes_with_it(synthetic_dir):
    splits = {seed: prepare(synthetic_dir, dataclasses.replace(SMALL, seed=seed), _quiet())[2]
              for seed in range(6)}
    assert splits[3] == prepare(synthetic_dir, dataclasses.replace(SMALL, seed=3), _quiet())[2]
    assert len({tuple(sorted(s.items())) for s in splits.values()}) > 1


def test_explicit_test_and_val_families_are_respected(synthetic_dir):
    cfg = dataclasses.replace(SMALL, test_families=("syn-zeta", "syn-alpha"), val_families=("syn-gamma",))
    result = train(cfg, synthetic_dir, None, log=_quiet())
    split = result["split"]
    assert {f for f, s in split.items() if s == "test"} == {"syn-zeta", "syn-alpha"}
    assert {f for f, s in split.items() if s == "val"} == {"syn-gamma"}
    assert {f for f, s in split.items() if s == "train"} == {"syn-beta", "syn-delta", "syn-epsilon"}
    assert set(result["metrics"]["test"]["per_family"]) == {"syn-zeta", "syn-alpha"}
    assert set(result["metrics"]["val"]["per_family"]) == {"syn-gamma"}
    assert set(result["metrics"]["train"]["per_family"]) == {"syn-beta", "syn-delta", "syn-epsilon"}
    assert result["metrics"]["test"]["overall"]["n"] == 8


@pytest.mark.parametrize("field", ["test_families", "val_families"])
def test_unknown_family_is_a_user_error_naming_the_families(synthetic_dir, field):
    cfg = dataclasses.replace(SMALL, **{field: ("syn-alpha", "gpt3")})
    with pytest.raises(UserError) as e:
        train(cfg, synthetic_dir, None, log=_quiet())
    message = str(e.value)
    assert "gpt3" in message and field.split("_")[0] in message
    assert all(f in message for f in FAMILIES)  # what the data does have


def test_holding_out_every_family_is_a_user_error(synthetic_dir):
    cfg = dataclasses.replace(SMALL, test_families=FAMILIES[:3], val_families=FAMILIES[3:])
    with pytest.raises(UserError, match="no family left to train on"):
        train(cfg, synthetic_dir, None, log=_quiet())


# --- seeding, early stopping ------------------------------------------------------------------------


def test_training_is_seeded_and_reproducible(synthetic_dir):
    samples = _samples(synthetic_dir)
    runs = [train(SMALL, synthetic_dir, None, log=_quiet()) for _ in range(2)]
    assert runs[0]["metrics"] == runs[1]["metrics"] and runs[0]["split"] == runs[1]["split"]
    assert runs[0]["val_mape"] == runs[1]["val_mape"] and runs[0]["best_epoch"] == runs[1]["best_epoch"]
    a, b = (predict_samples(r["model"], samples)["pred_ms"] for r in runs)
    assert np.array_equal(a, b)
    other = train(dataclasses.replace(SMALL, seed=1), synthetic_dir, None, log=_quiet())
    assert not np.array_equal(a, predict_samples(other["model"], samples)["pred_ms"])


def test_early_stopping_stops_when_patience_runs_out(synthetic_dir):
    """lr so small that the weights never move: validation never improves after epoch 1."""
    epochs, lines = [], []
    cfg = dataclasses.replace(SMALL, lr=1e-30, epochs=50, patience=3)
    result = train(cfg, synthetic_dir, None, log=lines.append, on_epoch=lambda e, v: epochs.append((e, v)))
    assert [e for e, _ in epochs] == [1, 2, 3, 4]
    assert result["best_epoch"] == 1 and result["val_mape"] == epochs[0][1]
    assert any("early stop" in line and "3 epochs" in line for line in lines)
    assert sum(line.startswith("epoch ") for line in lines) == 4


def test_without_early_stop_every_epoch_runs_and_the_best_is_kept(synthetic_dir):
    epochs = []
    cfg = dataclasses.replace(SMALL, epochs=4, patience=100)
    result = train(cfg, synthetic_dir, None, log=_quiet(), on_epoch=lambda e, v: epochs.append(v))
    assert len(epochs) == 4
    assert result["val_mape"] == min(epochs) and result["best_epoch"] == 1 + epochs.index(min(epochs))
    # the weights returned are the best epoch's, not the last one's
    _, _, _, parts = prepare(synthetic_dir, cfg, _quiet())
    p = predict_samples(result["model"], parts["val"])
    mape = float(np.mean(np.abs(p["pred_ms"][:, 3] / p["true_ms"][:, 3] - 1)) * 100)
    assert mape == pytest.approx(result["val_mape"], rel=1e-5)


# --- checkpoints ------------------------------------------------------------------------------------


def test_checkpoint_round_trip_reproduces_predictions_exactly(synthetic_dir, tmp_path):
    out = tmp_path / "ckpt"
    result = train(SMALL, synthetic_dir, out, log=_quiet())
    assert result["checkpoint"] == str(out)
    samples = _samples(synthetic_dir)
    model, meta = checkpoint.load(out)
    assert not model.training
    before, after = _predict_all(result["model"], samples), _predict_all(model, samples)
    for key in ("log_phase_ms", "log_node_ms", "log_memory"):
        assert torch.equal(before[key], after[key]), key

    assert META_KEYS <= set(meta)
    assert meta["feature_version"] == feature_version("cpu") and meta["hardware"] == "cpu"
    assert meta["trace_target"] == "cpu"
    assert meta["data_hash"] == dataset.data_hash(dataset.measured_configs(synthetic_dir))
    assert meta["split"] == result["split"] and meta["metrics"] == json.loads(json.dumps(result["metrics"]))
    assert ModelConfig(**meta["model"]) == SMALL.model
    assert TrainConfig.from_dict(meta["train"]) == SMALL
    ranges = meta["train_ranges"]
    train_samples = [s for s in samples if result["split"][s.family] == "train"]
    u = torch.cat([s.u for s in train_samples])
    assert len(ranges["u_min"]) == len(ranges["u_max"]) == GRAPH_FEATURES
    assert ranges["u_min"] == u.min(0).values.tolist() and ranges["u_max"] == u.max(0).values.tolist()
    assert ranges["nodes_min"] == min(s.num_nodes for s in train_samples)
    assert ranges["nodes_max"] == max(s.num_nodes for s in train_samples)
    assert set(ranges["op_ids"]) == set(torch.cat([s.x_cat[:, 0] for s in train_samples]).tolist())

    state = torch.load(out / "model.pt", weights_only=True)
    assert isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values())
    assert state.keys() == result["model"].state_dict().keys()


def test_checkpoint_from_another_feature_version_is_refused(synthetic_dir, tmp_path):
    out = tmp_path / "ckpt"
    train(SMALL, synthetic_dir, out, log=_quiet())
    meta = json.loads((out / "meta.json").read_text())
    meta["feature_version"] = "0"
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"(?s)v0.*retrain"):
        checkpoint.load(out)


def test_a_checkpoint_over_the_prior_notices_a_re_fitted_calibration(synthetic_dir, tmp_path, monkeypatch, capsys):
    from gnn_ptp import prior

    over_prior = dataclasses.replace(SMALL, model=dataclasses.replace(SMALL.model, target="log_ratio_prior"))
    out = tmp_path / "ckpt"
    train(over_prior, synthetic_dir, out, log=_quiet())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["prior_calibration"] == {"cpu": prior.calibration_digest("cpu")}
    checkpoint.load(out)
    assert "re-fitted" not in capsys.readouterr().err
    table = json.loads(json.dumps(prior.calibration()))
    table["cpu"]["launch_floor_s"] *= 2  # a re-fit of the curves the checkpoint was trained over
    monkeypatch.setattr(prior, "calibration", lambda: table)
    checkpoint.load(out)
    assert "'cpu' calibration as it was then" in capsys.readouterr().err


def test_a_queue_readout_trains_over_the_prior_and_its_checkpoint_predicts_the_same(synthetic_dir, tmp_path):
    """The queue readout (kernel corrections through the prior's step model) trains, is saved and loaded,
    and predicts what it predicted before saving; node labels are refused with it (their scale is the
    phase's, not the kernels')."""
    from gnn_ptp.train import predict_samples, prepare

    queue = dataclasses.replace(SMALL, model=dataclasses.replace(SMALL.model, target="log_ratio_prior",
                                                                readout="queue", hardware_descriptor=True))
    out = tmp_path / "ckpt"
    result = train(queue, synthetic_dir, out, log=_quiet())
    assert math.isfinite(result["val_mape"])
    model, meta = checkpoint.load(out)
    assert meta["model"]["readout"] == "queue" and hasattr(model, "host_scale")
    _, samples, _, _ = prepare(synthetic_dir, queue, _quiet())
    before = predict_samples(result["model"], samples)["pred_ms"]
    after = predict_samples(model, samples)["pred_ms"]
    assert np.isfinite(before).all() and after.flatten().tolist() == pytest.approx(before.flatten().tolist(), rel=1e-5)
    with pytest.raises(UserError, match="node_weight"):
        dataclasses.replace(queue, node_weight=1.0)


def test_trust_region_boundary_is_the_longest_training_kernel_and_is_saved(synthetic_dir, tmp_path):
    from gnn_ptp.train import prepare

    trusted = dataclasses.replace(SMALL, model=dataclasses.replace(SMALL.model, target="log_ratio_prior",
                                                                  hardware_descriptor=True, trust_region=True))
    result = train(trusted, synthetic_dir, tmp_path / "ckpt", log=_quiet())
    _, _, _, parts = prepare(synthetic_dir, trusted, _quiet())
    longest = max(float(s.prior_device_log_ms.max()) for s in parts["train"])
    assert float(result["model"].trust_log_ms) == pytest.approx(longest)
    model, _ = checkpoint.load(tmp_path / "ckpt")
    assert float(model.trust_log_ms) == pytest.approx(longest)


def test_trust_by_category_boundaries_are_each_categorys_longest_training_kernel(synthetic_dir, tmp_path):
    from gnn_ptp import ops
    from gnn_ptp.train import prepare

    trusted = dataclasses.replace(SMALL, model=dataclasses.replace(
        SMALL.model, target="log_ratio_prior", hardware_descriptor=True, trust_region=True, trust_by_category=True))
    result = train(trusted, synthetic_dir, tmp_path / "ckpt", log=_quiet())
    _, _, _, parts = prepare(synthetic_dir, trusted, _quiet())
    expected = {}
    for s in parts["train"]:
        for c, t in zip(s.x_cat[:, 1].tolist(), s.prior_device_log_ms.tolist()):
            expected[c] = max(expected.get(c, -math.inf), t)
    assert len(expected) > 1  # several categories, so a single boundary would differ
    model, _ = checkpoint.load(tmp_path / "ckpt")
    for m in (result["model"], model):
        for c, name in enumerate(ops.CATEGORIES):
            if c in expected:
                assert float(m.trust_log_ms[c]) == pytest.approx(expected[c], rel=1e-5), name
            else:
                assert float(m.trust_log_ms[c]) == -math.inf, name
    assert float(model.trust_log_ms.max()) == pytest.approx(max(expected.values()), rel=1e-5)


def test_missing_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no checkpoint at"):
        checkpoint.load(tmp_path / "nothing-here")


# --- TOML config --------------------------------------------------------------------------------------


def test_train_config_from_toml(tmp_path):
    path = tmp_path / "train.toml"
    path.write_text('lr = 0.01\nepochs = 7\ntest_families = "syn-alpha"\nval_families = ["syn-beta", "syn-gamma"]\n'
                    '[model]\nlayer = "gatv2"\nhidden = 32\nheads = 2\n')
    cfg = load_train_config(path)
    assert cfg.lr == 0.01 and cfg.epochs == 7
    assert cfg.test_families == ("syn-alpha",)  # one family, not nine letters
    assert cfg.val_families == ("syn-beta", "syn-gamma")
    assert cfg.model == ModelConfig(layer="gatv2", hidden=32, heads=2)
    assert load_train_config(None) == TrainConfig()


@pytest.mark.parametrize("text, match", [
    ("epoch = 3\n", r"unknown key 'epoch'.*did you mean 'epochs'"),
    ("[model]\nlayers = 'gine'\n", r"\[model\]: unknown key 'layers'.*did you mean 'layer'"),
    ("lr = -1.0\n", r"lr = -1.0 is out of range"),
    ("test_fraction = 0.6\nval_fraction = 0.5\n", r"test_fraction \+ val_fraction"),
    ("[model]\nnorm = 'rms'\n", r"norm 'rms' is not one of"),
    ("lr = \n", r"train.toml"),  # not TOML
])
def test_bad_toml_is_a_user_error(tmp_path, text, match):
    path = tmp_path / "train.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=match):
        load_train_config(path)


@pytest.mark.parametrize("text", ["epochs = 2.5\n", "batch_size = 2.5\n", "[model]\nhidden = 16.5\n"])
def test_non_integer_counts_are_a_user_error(tmp_path, text):
    path = tmp_path / "train.toml"
    path.write_text(text)
    with pytest.raises(UserError):
        load_train_config(path)


def test_missing_toml_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_train_config(tmp_path / "nope.toml")


# --- diverged runs ----------------------------------------------------------------------------------


def test_nan_loss_raises_training_diverged(synthetic_dir, monkeypatch, tmp_path):
    real_loss = train_mod._loss
    monkeypatch.setattr(train_mod, "_loss", lambda *a, **k: real_loss(*a, **k) * math.nan)
    with pytest.raises(TrainingDiverged, match=r"diverged.*lower the learning rate"):
        train(SMALL, synthetic_dir, tmp_path / "ckpt", log=_quiet())
    assert not (tmp_path / "ckpt").exists()  # no checkpoint of a diverged run


def test_huge_learning_rate_raises_training_diverged_not_a_crash(synthetic_dir):
    cfg = dataclasses.replace(SMALL, lr=1e10, epochs=4)
    with pytest.raises(TrainingDiverged, match="diverged"):
        train(cfg, synthetic_dir, None, log=_quiet())


def test_cli_train_writes_a_checkpoint(synthetic_dir, tmp_path, capsys):
    config = tmp_path / "small.toml"
    config.write_text("epochs = 50\nthreads = 1\n[model]\nhidden = 16\ndepth = 1\n")
    code = cli.main(["train", "--data", str(synthetic_dir), "--config", str(config), "--epochs", "2",
                     "--seed", "4", "--out", str(tmp_path / "ckpt")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert sum(line.startswith("epoch ") for line in err.splitlines()) == 2  # --epochs overrides the file
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    assert meta["train"]["epochs"] == 2 and meta["train"]["seed"] == 4 and meta["model"]["hidden"] == 16
