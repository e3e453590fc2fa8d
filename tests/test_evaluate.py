"""``gnn-ptp evaluate`` (gnn_ptp/evaluate.py) on a checkpoint trained on the SYNTHETIC dataset (made-up
graphs and times, see synthetic_data.py) with ``gnn-ptp train --baselines``: the JSON shape, the
baselines, the table, the parity plot and the CLI."""

from __future__ import annotations

import json
import shutil

import pytest

from gnn_ptp import cli, dataset, metrics
from gnn_ptp.errors import UserError
from gnn_ptp.evaluate import evaluate, format_table
from gnn_ptp.train import predict_samples

from synthetic_data import FAMILIES, load_synthetic_graphs, write_synthetic_dataset

SUMMARY_KEYS = {"mape", "median_ape", "p90_ape", "n"}
CONFIG = "epochs = 3\nthreads = 1\nseed = 2\n[model]\nhidden = 16\ndepth = 1\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data folder, checkpoint with baselines/precision_unaware/, checkpoint without), trained once."""
    root = tmp_path_factory.mktemp("evaluate")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dataset, "load_graphs", load_synthetic_graphs)
        data = write_synthetic_dataset(root / "synthetic-cpu")
        (root / "small.toml").write_text(CONFIG)
        for name, extra in (("with-baselines", ["--baselines"]), ("plain", [])):
            code = cli.main(["train", "--data", str(data), "--config", str(root / "small.toml"),
                             "--out", str(root / name), *extra])
            assert code == 0
    assert (root / "with-baselines" / "baselines" / "precision_unaware" / "meta.json").is_file()
    return data, root / "with-baselines", root / "plain"


@pytest.fixture(autouse=True)
def synthetic_graphs(monkeypatch):
    monkeypatch.setattr(dataset, "load_graphs", load_synthetic_graphs)


def _check_report(r: dict, families: set[str]) -> None:
    assert set(r) >= {"overall", "per_precision", "per_family"}
    assert set(r["overall"]) == SUMMARY_KEYS
    for key in ("mape", "median_ape", "p90_ape"):
        assert type(r["overall"][key]) is float and r["overall"][key] >= 0
    assert type(r["overall"]["n"]) is int
    assert set(r["per_precision"]) == {"fp32", "amp-bf16"}
    assert set(r["per_family"]) == families
    for group in ("per_precision", "per_family"):
        assert all(set(v) == SUMMARY_KEYS for v in r[group].values())
        assert sum(v["n"] for v in r[group].values()) == r["overall"]["n"]


def test_evaluate_json_shape_with_every_baseline(trained):
    data, ckpt, _ = trained
    logs = []
    r = evaluate(ckpt, data, log=logs.append)
    meta = json.loads((ckpt / "meta.json").read_text())
    held_out = {f for f, s in meta["split"].items() if s == "test"}
    assert r["split"] == "test" and r["hardware"] == "cpu" and set(r["held_out_families"]) == held_out
    _check_report(r, held_out)
    assert r["overall"]["n"] == 4 * len(held_out)
    assert set(r["baselines"]) == {"roofline", "graph_totals_ridge", "precision_unaware"}
    for report in r["baselines"].values():
        _check_report(report, held_out)
    assert set(r["per_phase"]) == {"forward", "backward", "optimizer"}
    assert r["memory"]["n"] == 3 * len(held_out)  # index 0 of each family has no peak memory
    assert r["winner"] in {"gnn", *r["baselines"]}
    assert r["gnn_vs_best_baseline"]["baseline"] in r["baselines"]
    assert r["trained_on_data_hash"] == r["data_hash"] == meta["data_hash"]
    assert not any("no precision-unaware baseline" in line for line in logs)
    json.loads(json.dumps(r))  # plain JSON: no numpy numbers


def test_evaluate_numbers_are_the_checkpoint_s_errors_on_the_held_out_families(trained):
    from gnn_ptp import checkpoint

    data, ckpt, _ = trained
    r = evaluate(ckpt, data, log=lambda m: None)
    model, meta = checkpoint.load(ckpt)
    measured = dataset.measured_configs(data)
    test = [s for s in dataset.make_samples(measured, load_synthetic_graphs(data, measured))
            if meta["split"][s.family] == "test"]
    p = predict_samples(model, test)
    want = metrics.summarize(metrics.ape(p["pred_ms"][:, 3], p["true_ms"][:, 3]))
    assert r["overall"] == pytest.approx(want)
    assert r["overall"]["mape"] == pytest.approx(meta["metrics"]["test"]["overall"]["mape"])


def test_without_a_baselines_folder_the_unaware_baseline_is_left_out(trained):
    data, _, plain = trained
    logs = []
    r = evaluate(plain, data, log=logs.append)
    assert set(r["baselines"]) == {"roofline", "graph_totals_ridge"}
    assert any("no precision-unaware baseline" in line and "--baselines" in line for line in logs)


@pytest.mark.parametrize("split", ["val", "train", "all"])
def test_other_splits(trained, split):
    data, ckpt, _ = trained
    meta = json.loads((ckpt / "meta.json").read_text())
    r = evaluate(ckpt, data, split=split, log=lambda m: None)
    families = set(FAMILIES) if split == "all" else {f for f, s in meta["split"].items() if s == split}
    assert set(r["per_family"]) == families and r["overall"]["n"] == 4 * len(families)
    assert r["held_out_families"] is None


def test_families_new_since_training_count_as_held_out(trained, tmp_path):
    data, ckpt, _ = trained
    grown = shutil.copytree(data, tmp_path / "grown")
    write_synthetic_dataset(grown, families=("syn-eta",))
    r = evaluate(ckpt, grown, log=lambda m: None)
    assert "syn-eta" in r["per_family"] and "syn-eta" in r["held_out_families"]
    assert r["data_hash"] != r["trained_on_data_hash"]


def test_bad_split_and_other_hardware_are_user_errors(trained, tmp_path):
    data, ckpt, _ = trained
    with pytest.raises(UserError, match="--split 'holdout'"):
        evaluate(ckpt, data, split="holdout")
    other = tmp_path / "h100-data"
    other.mkdir()
    rows = [json.loads(line) for line in (data / "synthetic.jsonl").read_text().splitlines()]
    for row in rows:
        row["env"]["hardware"] = "h100"
    (other / "synthetic.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(UserError, match="predicts 'cpu'.*is 'h100'"):
        evaluate(ckpt, other, log=lambda m: None)


def test_plot_writes_a_png(trained, tmp_path):
    data, ckpt, _ = trained
    png = tmp_path / "plots" / "parity.png"
    r = evaluate(ckpt, data, split="all", plot=str(png), log=lambda m: None)
    assert r["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_format_table_mentions_every_predictor(trained):
    data, ckpt, _ = trained
    r = evaluate(ckpt, data, log=lambda m: None)
    table = format_table(r)
    for label in ("gnn (precision-aware)", "gnn, precision-unaware", "roofline", "ridge on graph totals"):
        assert label in table
    for family in r["per_family"]:
        assert family in table
    assert "fp32" in table and "amp-bf16" in table
    assert f"{r['overall']['mape']:5.1f}%" in table
    assert "winner:" in table


def test_cli_evaluate_json_parses(trained, capsys):
    data, ckpt, _ = trained
    code = cli.main(["evaluate", "--checkpoint", str(ckpt), "--data", str(data), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    r = json.loads(out)
    assert set(r["overall"]) == SUMMARY_KEYS
    assert {"roofline", "graph_totals_ridge", "precision_unaware"} == set(r["baselines"])
    code = cli.main(["evaluate", "--checkpoint", str(ckpt), "--data", str(data)])
    out, err = capsys.readouterr()
    assert code == 0 and "ridge on graph totals" in out


def test_cli_evaluate_missing_checkpoint_is_one_line(trained, tmp_path, capsys):
    data, _, _ = trained
    code = cli.main(["evaluate", "--checkpoint", str(tmp_path / "none"), "--data", str(data)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("gnn-ptp evaluate: error: no checkpoint at")
    assert len(err.strip().splitlines()) == 1


def test_stored_ridge_gives_the_same_report_from_the_split_alone(trained, tmp_path, monkeypatch):
    """train stores the ridge baseline (fitted on its train/val families) in baselines/: evaluate then
    builds graphs of the evaluated split only, and reports exactly what a fit on all graphs reports."""
    import synthetic_data

    data, ckpt, _ = trained
    assert (ckpt / "baselines" / "graph_totals_ridge.json").is_file()
    asked = []

    def spy(data_dir, measured, precision_aware=True, log=None):
        asked.append(len(measured))
        return synthetic_data.load_synthetic_graphs(data_dir, measured, precision_aware, log)

    monkeypatch.setattr(dataset, "load_graphs", spy)
    with_stored = evaluate(ckpt, data, log=lambda m: None)
    n_all = len(dataset.measured_configs(data))
    assert asked and max(asked) == with_stored["overall"]["n"] < n_all
    refit = tmp_path / "refit"
    shutil.copytree(ckpt, refit)
    (refit / "baselines" / "graph_totals_ridge.json").unlink()
    asked.clear()
    without = evaluate(refit, data, log=lambda m: None)
    assert max(asked) == n_all
    for name in ("graph_totals_ridge", "roofline", "precision_unaware"):
        assert with_stored["baselines"][name]["overall"] == pytest.approx(without["baselines"][name]["overall"])
    assert with_stored["overall"] == without["overall"]


def test_a_residual_checkpoint_prices_another_cpu_kind_over_its_training_prior_moved(tmp_path, monkeypatch):
    """``evaluate --data`` another CPU kind's folder with a residual checkpoint (SYNTHETIC dataset, trained on
    the reference kind): that kind's steps are priced over the training kind's prior moved to it
    (``MovedPrior``), not over the kind's own calibrated section, as ``predict --cpu-kind`` and the hardware
    protocol do; the training kind's own steps are not moved; the report says which; the checkpoint names the
    kinds it was trained on (``hardware_kinds``)."""
    import copy

    from gnn_ptp import descriptor, prior
    from gnn_ptp.model import ModelConfig
    from gnn_ptp.train import TrainConfig, train

    from test_descriptor import synthetic_cpu

    folder = tmp_path / "descriptors"
    folder.mkdir()
    shutil.copy(descriptor.DESCRIPTOR_DIR / "amd-epyc.json", folder / "amd-epyc.json")
    descriptor.write(synthetic_cpu(0.5, "synthetic-half-cpu"), folder)
    monkeypatch.setattr(descriptor, "DESCRIPTOR_DIR", folder)
    table = copy.deepcopy(prior.calibration())  # the other kind has a section of its own (unlike it, not 2x)
    own = copy.deepcopy(table["cpu"])
    own["cpu_model"], own["launch_floor_s"] = "Synthetic Half CPU", table["cpu"]["launch_floor_s"] * 3
    table["cpu-synthetic-half-cpu"] = own
    monkeypatch.setattr(prior, "calibration", lambda: table)
    made = write_synthetic_dataset(tmp_path / "synthetic")
    home, other = tmp_path / "synthetic-amd-epyc", tmp_path / "synthetic-half"
    for folder, env in ((home, {"cpu_model": "AMD EPYC"}), (other, {"cpu_kind": "Synthetic Half CPU"})):
        folder.mkdir()
        with open(made / "synthetic.jsonl") as src, open(folder / "synthetic.jsonl", "w") as dst:
            for line in src:
                dst.write(json.dumps({**json.loads(line), "env": {"hardware": "cpu", **env}}) + "\n")
    cfg = TrainConfig(model=ModelConfig(hidden=16, depth=1, target="log_ratio_prior", hardware_descriptor=True),
                      epochs=2, threads=1)
    train(cfg, home, tmp_path / "ckpt", log=lambda m: None)
    assert json.loads((tmp_path / "ckpt" / "meta.json").read_text())["hardware_kinds"] == ["amd-epyc"]

    attached = []
    real_attach = descriptor.attach
    monkeypatch.setattr(descriptor, "attach", lambda samples, ds: (attached.append(list(ds)), real_attach(samples, ds)))
    logs = []
    r = evaluate(tmp_path / "ckpt", other, log=logs.append)
    # the synthetic kind measured no step probes: the default ("sized") moves it as "split", and says so
    assert r["prior_moved"] == {"kinds": ["synthetic-half-cpu"], "from": "amd-epyc", "mode": descriptor.CPU_TRANSFER,
                                "modes": {"synthetic-half-cpu": "split"}}
    assert "moved to synthetic-half-cpu (split)" in format_table(r)
    (ds,) = attached
    assert ds and all(isinstance(d, descriptor.MovedPrior) and d.source.name == "amd-epyc"
                      and d.target.name == "synthetic-half-cpu" for d in ds)
    assert "priced over the prior of amd-epyc" in format_table(r) and any("moved" in m for m in logs)
    # its roofline row is that moved prior (half the rates: twice the time), not the training kind's
    assert r["roofline_hardware"] == ["synthetic-half-cpu"] and "roofline: the prior as the gnn sees" in format_table(r)
    attached.clear()
    mine = evaluate(tmp_path / "ckpt", home, log=logs.append)
    assert "prior_moved" not in mine and not any(isinstance(d, descriptor.MovedPrior) for d in attached[0])
    assert "roofline_hardware" not in mine
    assert r["baselines"]["roofline"]["overall"]["mape"] != pytest.approx(mine["baselines"]["roofline"]["overall"]["mape"])


def test_residual_prior_for_moves_only_a_cpu_kind_the_checkpoint_was_not_trained_on():
    from gnn_ptp import descriptor

    from test_descriptor import synthetic_cpu

    home, other = descriptor.stored_cpus()["amd-epyc"], synthetic_cpu(0.5, "synthetic-half-cpu")
    assert descriptor.residual_prior_for(home, home) is home
    moved = descriptor.residual_prior_for(home, other)
    assert isinstance(moved, descriptor.MovedPrior) and moved.source is home and moved.target is other
    assert descriptor.residual_prior_for(home, other, ["amd-epyc", "synthetic-half-cpu"]) is other  # trained on it
    assert descriptor.residual_prior_for(None, other) is other
    h200 = descriptor.GPU_DESCRIPTORS["h200"]
    assert descriptor.residual_prior_for(home, h200) is h200 and descriptor.residual_prior_for(h200, other) is other


def test_a_checkpoint_trained_on_fastest_labels_is_scored_on_them(tmp_path):
    """A second SYNTHETIC pass of every configuration, 1.5x slower (a host slowed by interference), and a
    checkpoint trained with ``labels = "fastest"``: its meta carries the convention, ``evaluate`` scores it
    against the first pass's times (not the two passes' mean) and says so, and its test MAPE is the one
    training reported; a bad ``labels`` is one clear error naming what is allowed."""
    from gnn_ptp import checkpoint, records
    from gnn_ptp.train import TrainConfig

    data = write_synthetic_dataset(tmp_path / "synthetic-cpu")
    first = [json.loads(line) for line in (data / "synthetic.jsonl").read_text().splitlines()]
    for r in first:
        slower = {**r, "timing": {k: {**v, "median": v["median"] * 1.5} for k, v in r["timing"].items()}}
        records.append_record(slower, data, "pass-2.jsonl")
    (tmp_path / "fastest.toml").write_text('labels = "fastest"\n' + CONFIG)
    assert cli.main(["train", "--data", str(data), "--config", str(tmp_path / "fastest.toml"),
                     "--out", str(tmp_path / "ckpt")]) == 0
    model, meta = checkpoint.load(tmp_path / "ckpt")
    assert meta["train"]["labels"] == "fastest"
    r = evaluate(tmp_path / "ckpt", data, log=lambda m: None)
    assert r["labels"] == "fastest" and "labels: each configuration's fastest record" in format_table(r)
    truth = {x["key"]: x["timing"]["step_ms"]["median"] for x in first}
    measured = dataset.measured_configs(data, label="fastest")
    test = [s for s in dataset.make_samples(measured, load_synthetic_graphs(data, measured))
            if meta["split"][s.family] == "test"]
    assert all(s.y[0, 3].exp().item() == pytest.approx(truth[s.key], rel=1e-4) for s in test)
    p = predict_samples(model, test)
    assert r["overall"] == pytest.approx(metrics.summarize(metrics.ape(p["pred_ms"][:, 3], p["true_ms"][:, 3])))
    assert r["overall"]["mape"] == pytest.approx(meta["metrics"]["test"]["overall"]["mape"])
    with pytest.raises(UserError, match="labels = 'min'; allowed: mean, fastest"):
        TrainConfig(labels="min")
