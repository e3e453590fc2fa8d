"""Seed ensembles (``TrainConfig.ensemble_seeds``, ``model.SeedEnsemble``): how the members' answers combine,
what the checkpoint records and restores, and what refuses. On the SYNTHETIC dataset (made-up graphs and
times, synthetic_data.py) with tiny models: only the mechanism is tested, no figure of a real machine."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from gnn_ptp import checkpoint, dataset, descriptor, metrics
from gnn_ptp.errors import UserError
from gnn_ptp.model import ModelConfig, SeedEnsemble, StepTimeGNN, log_total, scatter_logsumexp
from gnn_ptp.train import TrainConfig, predict_samples, train

from synthetic_data import FAMILIES, load_synthetic_graphs, write_synthetic_dataset

RESIDUAL = TrainConfig(model=ModelConfig(hidden=16, depth=1, target="log_ratio_prior", hardware_descriptor=True),
                       epochs=2, threads=1, test_families=(FAMILIES[0],))


@pytest.fixture
def synthetic_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)
    return write_synthetic_dataset(tmp_path / "synthetic-cpu")


def _samples(folder):
    measured = dataset.measured_configs(folder)
    return dataset.make_samples(measured, dataset.load_graphs(folder, measured))


def test_the_ensemble_answers_the_members_geometric_mean_and_its_nodes_add_up(synthetic_dir):
    from torch_geometric.data import Batch

    samples = _samples(synthetic_dir)
    home = descriptor.stored_cpus()["amd-epyc"]
    batch = Batch.from_data_list(samples)
    members = []
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        m = StepTimeGNN(ModelConfig(hidden=16, depth=1, target="log_ratio_prior", hardware_descriptor=True)).eval()
        m.time_offset.fill_(0.3 * seed)  # members that disagree
        m.descriptor = home
        members.append(m)
    members[1].correction_scale = 0.5
    ensemble = SeedEnsemble(members).eval()
    with torch.no_grad():
        outs = [m(batch) for m in members]
        out = ensemble(batch)
    steps = torch.stack([log_total(o["log_phase_ms"]) for o in outs])
    assert torch.allclose(log_total(out["log_phase_ms"]), steps.mean(0), atol=1e-5)
    assert not torch.allclose(steps[0], steps[2], atol=1e-2)
    # phases in the members' geometric-mean proportions; memory their geometric mean
    phases = torch.stack([o["log_phase_ms"] for o in outs]).mean(0)
    assert torch.allclose(out["log_phase_ms"] - phases, (out["log_phase_ms"] - phases)[:, :1].expand_as(phases),
                          atol=1e-5)
    assert torch.allclose(out["log_memory"], torch.stack([o["log_memory"] for o in outs]).mean(0), atol=1e-6)
    # node times add up to their phase, as one model's do
    group = batch.batch * 3 + batch.phase
    summed = scatter_logsumexp(out["log_node_ms"], group, out["log_phase_ms"].numel()).view(-1, 3)
    assert torch.allclose(summed, out["log_phase_ms"], atol=1e-4)
    # the descriptor is the ensemble's: a copy told of another kind answers for it, the original is untouched
    import copy

    other = copy.copy(ensemble)
    other.descriptor = descriptor.stored_cpus()[next(k for k in descriptor.stored_cpus() if k != "amd-epyc")]
    with torch.no_grad():
        moved = other(batch)
        again = ensemble(batch)
    assert not torch.allclose(moved["log_phase_ms"], out["log_phase_ms"], atol=1e-3)
    assert torch.allclose(again["log_phase_ms"], out["log_phase_ms"]) and all(m.descriptor is home for m in members)
    with pytest.raises(ValueError, match="two members or more of one model config"):
        SeedEnsemble(members[:1])
    with pytest.raises(ValueError, match="two members or more of one model config"):
        SeedEnsemble([members[0], StepTimeGNN(ModelConfig(hidden=8, depth=1))])


def test_an_ensemble_checkpoint_trains_each_seed_on_its_own_validation_and_answers_as_it_scored(synthetic_dir,
                                                                                              tmp_path):
    cfg = dataclasses.replace(RESIDUAL, scale_on_validation=True, ensemble_seeds=(0, 3, 4))
    lines = []
    result = train(cfg, synthetic_dir, tmp_path / "ckpt", log=lines.append)
    members = result["ensemble"]["members"]
    assert [m["seed"] for m in members] == [0, 3, 4]
    assert all(FAMILIES[0] not in m["val_families"] for m in members)
    assert len({tuple(m["val_families"]) for m in members}) == 3  # drawn by each seed (0, 1 and 2 draw the same one here)
    assert all("chosen" in m["correction_scale"] for m in members)
    assert sum(line.startswith("ensemble member ") for line in lines) == 3
    roles = result["split"]
    assert roles[FAMILIES[0]] == "test"
    assert all(roles[f] == ("val" if all(f in m["val_families"] for m in members) else "train")
               for f in FAMILIES[1:])
    # each member is the one model its seed trains alone (same split, same seed: the same weights)
    alone = train(dataclasses.replace(cfg, ensemble_seeds=None, seed=3, val_families=tuple(members[1]["val_families"])),
                  synthetic_dir, None, log=lambda _: None)["model"]
    model, meta = checkpoint.load(tmp_path / "ckpt")
    assert isinstance(model, SeedEnsemble) and len(model.members) == 3
    for a, b in zip(alone.state_dict().values(), model.members[1].state_dict().values()):
        assert torch.equal(a, b)
    assert [m.correction_scale for m in model.members] == [m["correction_scale"]["chosen"] for m in members]
    assert model.correction_scale == 1.0 and "correction_scale" not in meta
    # the checkpoint answers each held-out step at the geometric mean of its members' step times
    test = [s for s in _samples(synthetic_dir) if s.family == FAMILIES[0]]
    each = np.array([predict_samples(m, test)["pred_ms"][:, 3] for m in model.members])
    pred = predict_samples(model, test)
    assert pred["pred_ms"][:, 3] == pytest.approx(np.exp(np.log(each).mean(0)), rel=1e-5)
    mape = metrics.ape(pred["pred_ms"][:, 3], pred["true_ms"][:, 3]).mean()
    assert meta["metrics"]["test"]["overall"]["mape"] == pytest.approx(mape, rel=1e-5)
    assert meta["ensemble"] == json.loads(json.dumps(result["ensemble"]))
    note = checkpoint.ensemble_note(meta)
    assert note.startswith("the geometric mean of 3 models trained with seeds 0, 3, 4, each its correction")
    from gnn_ptp.evaluate import evaluate, format_table
    from gnn_ptp.prediction import checkpoint_error

    r = evaluate(tmp_path / "ckpt", synthetic_dir, log=lambda _: None)
    assert r["overall"]["mape"] == pytest.approx(mape, rel=1e-4) and f"gnn: {note}" in format_table(r)
    err = checkpoint_error(meta, FAMILIES[0])
    assert err["ensemble"] == 3 and note in err["summary"]


def test_ensemble_seeds_are_checked_and_a_damaged_ensemble_refused(synthetic_dir, tmp_path):
    for bad in ([0], [1, 1], [0, "1"], [0, True], 3):
        with pytest.raises(UserError, match=r"ensemble_seeds = .* must be two different integer seeds or more"):
            TrainConfig.from_dict({"ensemble_seeds": bad})
    assert TrainConfig.from_dict({"ensemble_seeds": [3, 4]}).ensemble_seeds == (3, 4)
    from gnn_ptp.sweep import sweep

    with pytest.raises(UserError, match=r"ensemble_seeds = \[0, 1\]: a sweep scores each trial's one model"):
        sweep(synthetic_dir, 1, base=dataclasses.replace(RESIDUAL, ensemble_seeds=(0, 1)), log=lambda _: None)
    from gnn_ptp import protocol

    with pytest.raises(UserError, match=r"ensemble_seeds = \[0, 1\]: the protocol trains one model per fold and seed"):
        protocol.run("lofo", synthetic_dir, dataclasses.replace(RESIDUAL, ensemble_seeds=(0, 1), test_families=None),
                     protocol.Budget(epochs=1, seeds=(0, 1), threads=1), log=lambda _: None)
    train(dataclasses.replace(RESIDUAL, ensemble_seeds=(0, 1)), synthetic_dir, tmp_path / "ckpt", log=lambda _: None)
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    meta["ensemble"]["members"] = meta["ensemble"]["members"][:1]
    (tmp_path / "ckpt" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="ensemble lists no members .two or more.; the checkpoint is damaged"):
        checkpoint.load(tmp_path / "ckpt")


def test_cli_trains_an_ensemble_from_a_config_with_its_baseline_on_the_first_member_s_split(synthetic_dir, tmp_path):
    from gnn_ptp import cli

    config = tmp_path / "ensemble.toml"
    config.write_text('epochs = 1\nthreads = 1\ntest_families = ["syn-alpha"]\nensemble_seeds = [0, 3]\n'
                      '[model]\nhidden = 16\ndepth = 1\ntarget = "log_ratio_prior"\nhardware_descriptor = true\n')
    out = tmp_path / "ckpt"
    assert cli.main(["train", "--data", str(synthetic_dir), "--config", str(config), "--out", str(out),
                     "--baselines"]) == 0
    model, meta = checkpoint.load(out)
    assert isinstance(model, SeedEnsemble) and meta["train"]["ensemble_seeds"] == [0, 3]
    _, base = checkpoint.load(out / "baselines" / "precision_unaware")
    first = meta["ensemble"]["members"][0]
    assert "ensemble" not in base and base["model"]["precision_aware"] is False
    assert sorted(f for f, role in base["split"].items() if role == "val") == first["val_families"]
    assert sorted(f for f, role in base["split"].items() if role == "test") == ["syn-alpha"]
