"""The physical prior (gnn_ptp/prior.py) and predict's analytic H100 mode.

Closed-form checks on hand-built nodes (SYNTHETIC features, written as graph.py writes them) against the
shipped calibration, then traced steps of tiny real models: precision ratios of a matmul-bound MLP, batch
monotonicity, and the CLI answering for an H100 with no checkpoint (``default_checkpoint`` is made to find
none, as in a checkout without checkpoints/h100)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

import gnn_ptp.prediction as predict_mod
from gnn_ptp import cli, ops, prior
from gnn_ptp.errors import UserError
from gnn_ptp.graph import NODE_FEATURES
from gnn_ptp.hardware import HARDWARE
from gnn_ptp.precision import PRECISION_NAMES

from conftest import GPT2, PYMODELS, calibrate_prior_module

H100 = prior.get_profile("h100")
CPU = prior.get_profile("cpu")
TABLE = prior.calibration()


def _log(v: float) -> float:
    return math.log2(1.0 + v)


def _nodes(rows: list[dict]) -> dict:
    """Nodes {flops, bytes, dtype, tc, category, phase} as graph.to_tensors writes their features."""
    x = torch.zeros(len(rows), NODE_FEATURES)
    x_cat = torch.zeros(len(rows), 4, dtype=torch.long)
    for i, r in enumerate(rows):
        x[i, 0], x[i, 1], x[i, 2] = _log(r["flops"]), _log(r["bytes"] / 2), _log(r["bytes"] / 2)
        x[i, prior.TC_COLUMN] = float(r.get("tc", False))
        x_cat[i] = torch.tensor([0, ops.CATEGORIES.index(r.get("category", "matmul")), ops.DTYPE_ID[r["dtype"]],
                                 r.get("phase", 0)])
    return {"x": x, "x_cat": x_cat, "phase": x_cat[:, 3].clone()}


def _efficiency(curve: dict, size: float, intensity: float | None = None) -> float:
    out = curve["peak_fraction"] / (1 + (curve.get("half_size", 0) / size) ** curve.get("slope", 1.0))
    if intensity is not None and curve.get("intensity_half"):
        out /= 1 + (curve["intensity_half"] / intensity) ** curve.get("intensity_slope", 1.0)
    if curve.get("fraction_max"):  # a matmul curve held at its fastest fitted fraction (Curve.fraction_max)
        out = min(out, curve["fraction_max"])
    return out


def _gemm(dtype: str) -> dict:
    gemm = TABLE["h100"]["gemm"]
    return gemm.get(f"matmul:{dtype}", gemm.get(dtype))


def test_the_shipped_calibration_names_its_sources_and_held_out_families():
    assert {"h100", "cpu"} <= set(TABLE)
    h100 = TABLE["h100"]
    assert "--profiles" in h100["source"] and "--lofo" in h100["source"] and h100["fit_families"]
    lofo = h100["errors"]["lofo"]  # every family fitted, and every family judged by a fit without it
    assert lofo["all"]["n"] >= 100 and set(h100["fit_families"]) < set(lofo["by_family"])
    assert lofo["worst_family_mape"] == max(v["mape"] for v in lofo["by_family"].values())
    import tomllib
    from pathlib import Path

    split = tomllib.loads((Path(__file__).parent.parent / "training" / "h200.toml").read_text())
    # the H200 checkpoint is a residual over this prior: its test families must be unseen by both
    assert split["test_families"] and not set(split["test_families"]) & set(h100["fit_families"])
    assert len(h100["host_issue_s"]) == 3 and all(0 < h < 1e-3 for h in h100["host_issue_s"])
    assert "held-out" in h100["expected_error"]["summary"] or "never saw" in h100["expected_error"]["summary"]
    assert "NeuSight" in TABLE["h100-neusight"]["source"]  # the earlier public-kernel fit, kept to compare
    big, thin = torch.tensor([1e13], dtype=torch.float64), torch.tensor([10.0], dtype=torch.float64)
    for dtype in ("fp32", "tf32", "fp16", "bf16"):
        for category in ("matmul", "conv", "attention"):
            curve = H100.gemm_curve(dtype, category)
            assert 0.1 < curve(big, torch.tensor([2000.0], dtype=torch.float64)).item() <= 1.0
            assert curve(big, thin).item() <= curve(big).item()  # a thin kernel never beats a square one


@pytest.mark.parametrize("dtype,tc,flops", [("bf16", True, 2.0 * 8192**3), ("tf32", True, 2.0 * 512**3),
                                            ("fp32", False, 2.0 * 2048**3)])
def test_a_single_gemm_node_takes_the_closed_form_time(dtype, tc, flops):
    moved = 3 * 2 * 4096.0**2
    g = _nodes([{"flops": flops, "bytes": moved, "dtype": dtype, "tc": tc}])
    got = prior.node_seconds(g["x"], g["x_cat"], H100)
    cal = TABLE["h100"]
    compute = flops / (HARDWARE["h100"].flops_per_s[dtype] * _efficiency(_gemm(dtype), flops, flops / (moved + 1)))
    memory = moved / (3.35e12 * _efficiency(cal["memory"], moved))
    want = max(compute, memory, cal["launch_floor_s"])
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_tiny_kernels_cost_the_device_floor_and_memory_bound_ones_the_bandwidth():
    g = _nodes([{"flops": 10.0, "bytes": 64.0, "dtype": "fp32", "category": "elementwise"},
                {"flops": 2**28, "bytes": 3 * 2**30, "dtype": "fp32", "category": "elementwise"}])
    t = prior.node_seconds(g["x"], g["x_cat"], H100)
    assert TABLE["h100"]["launch_floor_s"] <= t[0].item() < 5e-6  # the floor, or the memory curve's ramp
    curve = dict(TABLE["h100"]["memory"])  # with fp32 element-wise kernels' own fraction and half size, if fitted
    for key, own in (("peak_fraction", "memory_fraction"), ("half_size", "memory_half_size")):
        if "elementwise:fp32" in TABLE["h100"].get(own, {}):
            curve[key] = TABLE["h100"][own]["elementwise:fp32"]
    assert t[1].item() == pytest.approx(3 * 2**30 / (3.35e12 * _efficiency(curve, 3 * 2**30)), rel=1e-5)


def test_a_launch_queue_is_gpu_bound_for_long_kernels_and_host_bound_for_short_ones():
    long, short = torch.full((10,), 1e-3, dtype=torch.float64), torch.full((10,), 1e-6, dtype=torch.float64)
    assert prior.queue_ms(long, 50e-6) == pytest.approx(50e-3 + 10.0)  # one issue, then the GPU's sum
    assert prior.queue_ms(short, 50e-6) == pytest.approx(10 * 50e-3 + 1e-3)  # the host's pace
    assert prior.queue_ms(torch.zeros(0, dtype=torch.float64), 50e-6) == 0.0
    mixed = torch.tensor([1e-6, 1e-6, 2e-3, 1e-6], dtype=torch.float64)  # the host catches up behind a long one
    assert prior.queue_ms(mixed, 50e-6) == pytest.approx((3 * 50e-6 + 2e-3 + 1e-6) * 1e3)


def test_a_busy_gpu_hides_the_hosts_issuing_from_phase_to_phase_and_step_to_step():
    profile = dataclasses.replace(H100, host_issue_s=(50e-6, 50e-6, 50e-6), host_fixed_s=(100e-6, 100e-6, 100e-6))
    phase = torch.tensor([0, 1, 2, 2, 2])
    # one long forward kernel, then tiny ones: the host issues the backward and optimizer while the GPU is
    # still in the forward, so both phases last their kernels alone
    busy = torch.tensor([10e-3, 1e-6, 1e-6, 1e-6, 1e-6], dtype=torch.float64)
    assert prior.graph_phase_ms(busy, phase, profile).tolist() == pytest.approx([10.0, 1e-3, 3e-3])
    # all tiny: host-bound, each phase its fixed cost and issues (the lag left is one tiny kernel)
    idle = torch.full((5,), 1e-6, dtype=torch.float64)
    assert prior.graph_phase_ms(idle, phase, profile).tolist() == pytest.approx([0.15, 0.15, 0.25], rel=1e-9)
    ms, lag = prior.phase_after(idle[2:], 50e-6, 100e-6, 0.0)
    assert ms == pytest.approx(0.251) and lag == pytest.approx(1e-6)
    ms, lag = prior.phase_after(idle[2:], 50e-6, 100e-6, 1e-3)  # behind a GPU 1 ms busy: its kernels alone
    assert ms == pytest.approx(3e-3) and lag == pytest.approx(1e-3 + 3e-6 - 250e-6)


def test_per_node_prior_times_add_up_to_the_queue_per_phase_of_each_graph_in_a_batch():
    one = _nodes([{"flops": 2.0 * 4096**3, "bytes": 1e8, "dtype": "bf16", "tc": True, "phase": 0},
                  {"flops": 1e3, "bytes": 1e4, "dtype": "fp32", "category": "elementwise", "phase": 1},
                  {"flops": 1e3, "bytes": 1e4, "dtype": "fp32", "category": "optimizer", "phase": 2}])
    two = _nodes([{"flops": 1e3, "bytes": 1e4, "dtype": "fp32", "category": "elementwise", "phase": p}
                  for p in (0, 0, 1, 2)])
    batch = {k: torch.cat([one[k], two[k]]) for k in one}
    batch["batch"] = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    node_ms = prior.log_node_ms(batch, H100).double().exp()
    for g, graph in enumerate((one, two)):
        want = prior.phase_ms(graph, H100)[:3]
        mine = batch["batch"] == g
        got = torch.zeros(3, dtype=torch.float64).index_add(0, batch["phase"][mine], node_ms[mine])
        assert got.tolist() == pytest.approx(want.tolist(), rel=1e-5)
        alone = prior.log_node_ms(graph, H100).double().exp()
        assert alone.tolist() == pytest.approx(node_ms[mine].tolist(), rel=1e-6)  # a batch changes nothing


def test_gemm_like_kernels_take_their_categorys_curve_and_the_intensity_ramp():
    curves = {"matmul:bf16": prior.Curve(0.8), "conv:bf16": prior.Curve(0.4, intensity_half=100.0),
              "fp32": prior.Curve(0.5)}
    profile = prior.Profile(HARDWARE["h100"], gemm=curves)
    assert profile.gemm_curve("bf16", "conv") is curves["conv:bf16"]
    assert profile.gemm_curve("bf16", "attention") is curves["matmul:bf16"]  # no own curve, no dtype curve
    assert profile.gemm_curve("fp32", "conv") is curves["fp32"]
    assert profile.gemm_curve("fp16", "matmul") == prior.Curve()  # nothing for fp16: the plain roofline
    size = torch.tensor([1e12], dtype=torch.float64)
    assert curves["conv:bf16"](size).item() == pytest.approx(0.4)  # no intensity given: the size curve
    assert curves["conv:bf16"](size, torch.tensor([100.0], dtype=torch.float64)).item() == pytest.approx(0.2)
    flops, moved = 2.0 * 4096**3, 3 * 2 * 4096.0**2  # intensity ~ 1365 FLOP/B
    g = _nodes([{"flops": flops, "bytes": moved, "dtype": "bf16", "tc": True, "category": c}
                for c in ("matmul", "conv")])
    t = prior.node_seconds(g["x"], g["x_cat"], profile)
    ramp = 1 / (1 + 100.0 / (flops / (moved + 1)))
    assert (t[1] / t[0]).item() == pytest.approx(0.8 / (0.4 * ramp), rel=1e-3)


def test_cpu_fp32_matmuls_run_at_the_measured_gemm_rate_not_the_elementwise_rate():
    node = _nodes([{"flops": 2.0 * 1024**3, "bytes": 3 * 4 * 1024.0**2, "dtype": "fp32"}])
    cpu_s = prior.node_seconds(node["x"], node["x_cat"], CPU).item()
    h100_s = prior.node_seconds(node["x"], node["x_cat"], H100).item()
    gemm = HARDWARE["cpu"].flops_per_s["fp32"]
    flops, moved = 2.0 * 1024**3, 3 * 4 * 1024.0**2
    curve = TABLE["cpu"]["gemm"]["matmul:fp32"]  # fitted to the CPU's profiled kernels, per category
    assert cpu_s == pytest.approx(flops / (gemm * _efficiency(curve, flops, flops / (moved + 1))), rel=1e-5)
    assert cpu_s < 2.0 * 1024**3 / HARDWARE["cpu"].vector_flops_per_s / 5
    assert 100 < cpu_s / h100_s < 10000  # tens of GFLOP/s against tens of TFLOP/s


def test_phase_sums_and_log_node_ms_agree_without_host_costs_and_queue_with_them():
    g = _nodes([{"flops": 2.0 * 1024**3, "bytes": 1e7, "dtype": "bf16", "tc": True, "phase": 0},
                {"flops": 1e6, "bytes": 1e8, "dtype": "fp32", "category": "elementwise", "phase": 1},
                {"flops": 1e5, "bytes": 1e6, "dtype": "fp32", "category": "optimizer", "phase": 2},
                {"flops": 1e3, "bytes": 1e3, "dtype": "fp32", "category": "elementwise", "phase": 2}])
    plain = dataclasses.replace(H100, host_issue_s=None, host_fixed_s=None)
    ms = prior.phase_ms(g, plain)
    node_ms = prior.log_node_ms(g, plain).double().exp()
    assert ms[:3] == pytest.approx([node_ms[0].item(), node_ms[1].item(), (node_ms[2] + node_ms[3]).item()],
                                   rel=1e-5)
    assert ms[3] == pytest.approx(ms[:3].sum())
    queued = prior.phase_ms(g, H100)
    t = prior.node_seconds(g["x"], g["x_cat"], H100)
    host, fixed = H100.host_issue_s, H100.host_fixed_s
    # tiny kernels: every phase host-bound, and the GPU's lag at the end of a phase is its last kernel
    lag = t[3].item()  # the previous step's optimizer leaves its last kernel running
    want_fwd = fixed[0] + host[0] + t[0].item() - lag
    assert queued[0] == pytest.approx(want_fwd * 1e3, rel=1e-6)
    want_opt = fixed[2] + max(host[2] + t[2].item() + t[3].item(), 2 * host[2] + t[3].item()) - t[1].item()
    assert queued[2] == pytest.approx(want_opt * 1e3, rel=1e-6)
    # per-node times for a queue profile: at least the host issue cost of their phase
    issue = prior.log_node_ms(g, H100).double().exp()
    floor = torch.tensor([host[p] * 1e3 for p in g["phase"].tolist()], dtype=torch.float64)
    assert (issue >= floor * (1 - 1e-5)).all()  # float32 log times


@pytest.fixture
def no_h100_checkpoint(monkeypatch, tmp_path):
    """A checkout without checkpoints/h100; graphs cached under tmp."""
    def missing(hardware):
        raise UserError(f"no {hardware} checkpoint is shipped yet")

    monkeypatch.setattr(predict_mod, "default_checkpoint", missing)
    monkeypatch.setenv("GNN_PTP_CACHE", str(tmp_path / "cache"))


MLP = f"py:{PYMODELS}:mlp2"
BIG = ["in_features=4096", "hidden=4096", "out_features=4096"]


def test_a_matmul_bound_step_is_faster_in_bf16_than_tf32_and_fp32_by_about_the_rate_ratio(no_h100_checkpoint):
    rows = {p.precision: p for p in predict_mod.predict_many(MLP, ["fp32", "tf32", "bf16"], 32768, overrides=BIG,
                                                              use_disk_cache=False)}
    assert all(p.source == "analytic-prior" for p in rows.values())
    fwd = {k: p.forward_ms for k, p in rows.items()}
    rates = HARDWARE["h100"].flops_per_s
    flops = 2.0 * 32768 * 4096**2
    eff = {d: _efficiency(_gemm(d), flops, flops / ((2 * 32768 * 4096 + 4096**2) * (2 if d == "bf16" else 4)))
           for d in ("fp32", "tf32", "bf16")}
    # the forward is two 1.1 TFLOP GEMMs plus small element-wise kernels and the host's issue costs: within
    # 15 % of the GEMM ratio
    assert fwd["fp32"] / fwd["bf16"] == pytest.approx(rates["bf16"] * eff["bf16"] / (rates["fp32"] * eff["fp32"]),
                                                      rel=0.15)
    assert fwd["tf32"] / fwd["bf16"] == pytest.approx(rates["bf16"] * eff["bf16"] / (rates["tf32"] * eff["tf32"]),
                                                      rel=0.15)
    assert rows["bf16"].iteration_ms < rows["tf32"].iteration_ms < rows["fp32"].iteration_ms


def test_analytic_step_time_grows_with_batch_size(no_h100_checkpoint):
    times = [predict_mod.predict_many(MLP, ["amp-bf16"], b, overrides=["in_features=4096", "hidden=8192"],
                                      use_disk_cache=False)[0] for b in (64, 512, 4096, 32768)]
    compute = [p.forward_ms + p.backward_ms for p in times]
    assert all(b >= a * (1 - 1e-6) for a, b in zip(compute, compute[1:]))  # host-bound small batches tie
    assert compute[-1] > 4 * compute[1]


def test_a_checkpoint_still_wins_over_the_prior(monkeypatch, tmp_path):
    """With a checkpoint for the hardware, predict never answers from the prior."""
    seen = []
    monkeypatch.setattr(predict_mod, "default_checkpoint", lambda hw: seen.append(hw) or tmp_path / "nope")
    with pytest.raises(Exception):  # the (missing) checkpoint is loaded, not replaced by the prior
        predict_mod.predict_many(MLP, ["fp32"], 8, hardware="h100")
    assert seen == ["h100"]


def test_cli_predicts_an_h100_analytically_with_a_warning(no_h100_checkpoint, capsys):
    spec, sets = GPT2
    args = ["predict", spec, *[a for s in sets for a in ("--set", s)], "--batch-size", "2", "--seq-len", "32",
            "--hardware", "h100"]
    assert cli.main(args + ["--precision", "all"]) == 0
    out = capsys.readouterr().out
    assert "ANALYTIC ESTIMATE" in out and "analytic estimate from the calibrated prior" in out
    table = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in PRECISION_NAMES]
    assert table == list(PRECISION_NAMES)
    assert cli.main(args + ["--precision", "amp-bf16", "--gpus", "8", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["source"] == "analytic-prior"
    assert row["expected_error"]["summary"].endswith("; on an H100 not measured (same compute, less bandwidth)")
    assert row["interconnect"] == "h100-nvswitch" and row["comm_total_ms"] > 0
    assert row["iteration_ms"] >= row["compute_ms"] > 0
    assert row["peak_memory_bytes"] > 0 and row["fits_in_memory"] is True  # analytic memory, no checkpoint needed


def test_analytic_flag_answers_from_the_prior_where_a_checkpoint_is_shipped(capsys):
    """--analytic: the shipped h200 checkpoint is not loaded (the prior answers, said so), the same times as
    the prior's own; with --checkpoint, or for hardware without a calibrated prior, one clear error."""
    spec, sets = GPT2
    args = ["predict", spec, *[a for s in sets for a in ("--set", s)], "--batch-size", "2", "--seq-len", "32",
            "--hardware", "h200", "--precision", "bf16", "--json"]
    assert cli.main(args + ["--analytic"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["source"] == "analytic-prior" and row["checkpoint"] == ""
    assert any("ANALYTIC ESTIMATE (--analytic)" in w for w in row["warnings"])
    assert row["compute_ms"] > 0
    # the prior was fitted on H200 steps: its expected error is said as measured, with no other GPU's caveat
    assert "H200 steps" in row["expected_error"]["summary"] and "not measured" not in row["expected_error"]["summary"]
    assert cli.main(args) == 0  # without the flag: the shipped checkpoint answers, with other times
    plain = json.loads(capsys.readouterr().out)
    assert plain["source"] == "checkpoint" and plain["checkpoint"].endswith("h200")
    assert plain["compute_ms"] != row["compute_ms"]
    with pytest.raises(UserError, match="not both"):
        predict_mod.predict_many(MLP, ["fp32"], 8, hardware="h200", checkpoint="checkpoints/h200", analytic=True)
    with pytest.raises(UserError, match="no calibrated prior for --hardware tpu"):
        predict_mod.predict_many(MLP, ["fp32"], 8, hardware="tpu", analytic=True)


def test_predict_analytic_on_a_cpu_kind_answers_from_that_kind_s_own_prior():
    """``--hardware cpu --analytic``: the reference CPU's prior (section ``cpu``) without ``--cpu-kind``, a
    stored kind's own section with it (the fourth kind's, fitted to its own steps, with the slow-path
    convolution law), each with its own expected
    error; the classes shown are those the CPU priors are fitted to; an unknown kind is one clear error."""
    from gnn_ptp import descriptor, prior

    [ref] = predict_mod.predict_many(MLP, ["bf16"], 8, hardware="cpu", analytic=True)
    [fourth] = predict_mod.predict_many(MLP, ["bf16"], 8, hardware="cpu", analytic=True,
                                        cpu_kind="amd-epyc-family-25-model-1")
    for p, kind, section in ((ref, "amd-epyc", "cpu"), (fourth, "amd-epyc-family-25-model-1",
                                                        "cpu-amd-epyc-family-25-model-1")):
        assert p.source == "analytic-prior" and p.checkpoint == ""
        assert any("ANALYTIC ESTIMATE (--analytic)" in w and f"kind {kind}" in w for w in p.warnings)
        # the section's own figure, with what its steps were labelled by where it says (the reference's: fastest)
        assert p.expected_error["summary"] == prior._labelled_error(prior.calibration()[section])["summary"]
    assert "uncontended step" in ref.expected_error["summary"]
    assert "uncontended step" not in fourth.expected_error["summary"]
    assert abs(fourth.compute_ms / ref.compute_ms - 1) > 0.05  # each kind's own prior, not one moved
    want = prior.phase_ms(predict_mod._graphs([predict_mod.StepConfig(predict_mod.parse_spec(MLP, None, None),
                                                                      predict_mod.Shape(8, None, None), "bf16",
                                                                      "adamw", "cpu")], True)[0][0],
                          descriptor.stored_cpus()["amd-epyc-family-25-model-1"].profile())[3]
    assert fourth.compute_ms == pytest.approx(want, rel=1e-4)
    every = predict_mod.predict_many(MLP, ["all"], 8, hardware="cpu", analytic=True)
    assert [p.precision for p in every] == ["fp32", "amp-bf16", "bf16"]
    with pytest.raises(UserError, match="--cpu-kind nope: no stored descriptor"):
        predict_mod.predict_many(MLP, ["fp32"], 8, hardware="cpu", analytic=True, cpu_kind="nope")


def _graph(categories_flops: list[tuple[str, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic node tensors: one node per (category, FLOPs)."""
    x = torch.zeros(len(categories_flops), NODE_FEATURES)
    x[:, 0] = torch.log2(1 + torch.tensor([f for _, f in categories_flops], dtype=torch.float64)).float()
    x_cat = torch.zeros(len(categories_flops), 4, dtype=torch.long)
    x_cat[:, 1] = torch.tensor([ops.CATEGORIES.index(c) for c, _ in categories_flops])
    return x, x_cat


def test_conv_flops_share_counts_convolutions_among_gemm_like_kernels_only():
    x, x_cat = _graph([("conv", 3e9), ("matmul", 1e9), ("elementwise", 50e9)])
    assert prior.conv_flops_share(x, x_cat) == pytest.approx(0.75, rel=1e-4)
    x, x_cat = _graph([("elementwise", 1e6)])
    assert prior.conv_flops_share(x, x_cat) == 0.0


def test_model_error_is_the_family_s_own_left_out_figure_else_its_kind_s_spread(monkeypatch):
    """Synthetic per-family figures: a fitted family gets its own; an unknown one the spread of the families
    of its kind (convolutional by FLOPs share, or not); a section without per-family figures gives None."""
    by_family = {"resnet": {"mape": 20.0, "median_ape": 15.0, "n": 9}, "vgg": {"mape": 10.0, "median_ape": 8.0, "n": 6},
                 "gpt2": {"mape": 12.0, "median_ape": 7.0, "n": 30}, "bert": {"mape": 6.0, "median_ape": 5.0, "n": 3}}
    monkeypatch.setattr(prior, "calibration", lambda: {"s": {"errors": {"lofo": {"by_family": by_family}}}, "bare": {}})
    own = prior.model_error("s", "gpt2", 0.9)  # its family's figure, whatever its FLOPs
    assert own["basis"] == "family" and own["mape"] == 12.0 and "(gpt2)" in own["text"] and "12 %" in own["text"]
    conv = prior.model_error("s", "custom-net", 0.6)
    assert conv["basis"] == "kin" and conv["families"] == ["resnet", "vgg"] and conv["mape_range"] == [10.0, 20.0]
    assert conv["mape"] == pytest.approx(15.0) and "10-20 % (mean 15 %)" in conv["text"]
    other = prior.model_error("s", "custom-net", 0.4)
    assert other["families"] == ["bert", "gpt2"] and other["mape"] == pytest.approx(9.0)
    assert prior.model_error("bare", "gpt2", 0.0) is None and prior.model_error("missing", "gpt2", 0.0) is None


def test_an_analytic_prediction_names_its_family_s_expected_error(no_h100_checkpoint, capsys):
    """The shipped h100 section's own per-family figure (left out of the fit) reaches the JSON and the
    warning line; a custom model gets its kind's spread."""
    spec, sets = GPT2
    args = ["predict", spec, *[a for s in sets for a in ("--set", s)], "--batch-size", "2", "--seq-len", "32",
            "--precision", "bf16", "--json"]
    assert cli.main(args) == 0
    row = json.loads(capsys.readouterr().out)
    want = prior.calibration()["h100"]["errors"]["lofo"]["by_family"]["gpt2"]["mape"]
    this = row["expected_error"]["this_model"]
    assert this["basis"] == "family" and this["family"] == "gpt2" and this["mape"] == want
    assert any(w.startswith("ANALYTIC ESTIMATE") and w.endswith(this["text"]) for w in row["warnings"])
    [mlp] = predict_mod.predict_many(MLP, ["bf16"], 8, use_disk_cache=False)
    kin = mlp.expected_error["this_model"]
    assert kin["basis"] == "kin" and "resnet" not in kin["families"] and "gpt2" in kin["families"]


def test_expected_error_names_the_gpu_it_was_not_measured_on():
    from gnn_ptp import prior

    fitted = dataclasses.replace(prior.get_profile("h100"), expected_error={"summary": "9 % on H200 steps"},
                                 fitted_on="h200")
    assert prior.expected_error_on("h200", fitted)["summary"] == "9 % on H200 steps"
    assert prior.expected_error_on("h100", fitted)["summary"].endswith("on an H100 not measured (same compute, "
                                                                       "less bandwidth)")
    assert "on an A100 not measured (the h200's curves" in prior.expected_error_on("a100", fitted)["summary"]
    assert fitted.expected_error == {"summary": "9 % on H200 steps"}  # the profile's own is left as it was


def test_hardware_without_a_prior_or_checkpoint_is_still_one_clear_error(no_h100_checkpoint):
    with pytest.raises(UserError, match="no cpu checkpoint"):
        predict_mod.predict_many(MLP, ["fp32"], 8, hardware="cpu")


# --- the prior as a node feature (ModelConfig.prior_feature, off by default) ------------------------------


def test_the_prior_node_feature_is_off_by_default_and_changes_nothing_then():
    from gnn_ptp.model import ModelConfig, StepTimeGNN

    assert ModelConfig().prior_feature == ""
    off, on = StepTimeGNN(ModelConfig(hidden=16, depth=1)), StepTimeGNN(ModelConfig(hidden=16, depth=1,
                                                                                    prior_feature="cpu"))
    assert on.node_in[0].in_features == off.node_in[0].in_features + 1


def test_the_prior_node_feature_feeds_the_prior_log_time(monkeypatch):
    from torch_geometric.data import Batch, Data

    from gnn_ptp.model import ModelConfig, StepTimeGNN

    g = _nodes([{"flops": 2.0 * 512**3, "bytes": 3e6, "dtype": "fp32", "phase": 0},
                {"flops": 1e5, "bytes": 1e6, "dtype": "fp32", "category": "elementwise", "phase": 1}])
    data = Data(x=g["x"], x_cat=g["x_cat"], phase=g["phase"], edge_index=torch.tensor([[0], [1]]),
                edge_attr=torch.ones(1, 1), u=torch.zeros(1, _graph_features()), num_nodes=2)
    model = StepTimeGNN(ModelConfig(hidden=16, depth=1, prior_feature="cpu")).eval()
    seen = []
    first = model.node_in[0]
    monkeypatch.setattr(model.node_in, "0", _Spy(first, seen))
    model(Batch.from_data_list([data]))
    want = prior.log_node_ms(g, CPU)
    torch.testing.assert_close(seen[0][:, -1], want)
    with pytest.raises(UserError, match="prior_feature"):
        ModelConfig(prior_feature="tpu")


def _graph_features() -> int:
    from gnn_ptp.graph import GRAPH_FEATURES

    return GRAPH_FEATURES


class _Spy(torch.nn.Module):
    def __init__(self, inner, seen):
        super().__init__()
        self.inner, self.seen = inner, seen

    def forward(self, x):
        self.seen.append(x.detach())
        return self.inner(x)


@pytest.mark.parametrize("host", ["gpu-queue", "cpu-serial", "none"])
def test_the_differentiable_step_model_is_the_launch_queue(host):
    """``phase_seconds`` (torch ops, for a GNN that corrects kernel times) gives ``graph_phase_ms``'s phases
    on random graphs: the queue with lag across phases and steps on a GPU, the serial sum on a CPU, plain
    sums without host costs; the optimizer issued once per parameter tensor."""
    profile = {"gpu-queue": dataclasses.replace(H100, host_issue_s=(40e-6, 55e-6, 30e-6),
                                                host_fixed_s=(200e-6, 400e-6, 300e-6)),
               "cpu-serial": dataclasses.replace(H100, host_issue_s=(4e-6, 5e-6, 3e-6),
                                                 host_fixed_s=(20e-6, 40e-6, 30e-6),
                                                 hardware=dataclasses.replace(H100.hardware, kind="cpu")),
               "none": dataclasses.replace(H100, host_issue_s=None, host_fixed_s=None)}[host]
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(3, 60, (1,), generator=gen))
        phase = torch.sort(torch.randint(0, 3, (n,), generator=gen)).values
        seconds = torch.exp(torch.randn(n, generator=gen, dtype=torch.float64) * 2) * 20e-6
        grad_bytes = torch.where(phase == 1, torch.randint(0, 2, (n,), generator=gen) * 1e6, 0.0).double()
        grad_bytes[: int(torch.randint(0, 40, (1,), generator=gen))] += 1.0  # sometimes more tensors than kernels
        want = prior.graph_phase_ms(seconds, phase, profile, grad_bytes)
        got = prior.phase_seconds(seconds, phase, prior.host_vector(profile)[0], prior.param_tensors(grad_bytes)) * 1e3
        assert got.tolist() == pytest.approx(want.tolist(), rel=1e-12)
    # a factor on the host costs is a profile with those costs scaled; on tiny (host-bound) kernels it moves
    # every phase, and its gradient says so
    seconds = torch.full_like(seconds, 1e-6)
    scale = torch.tensor([1.5, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    scaled = dataclasses.replace(profile, host_issue_s=tuple(v * f for v, f in zip(profile.host_issue_s or (0,) * 3, scale.tolist())),
                                 host_fixed_s=tuple(v * f for v, f in zip(profile.host_fixed_s or (0,) * 3, scale.tolist())))
    got = prior.phase_seconds(seconds, phase, prior.host_vector(profile)[0], prior.param_tensors(grad_bytes), scale)
    assert (got * 1e3).tolist() == pytest.approx(prior.graph_phase_ms(seconds, phase, scaled, grad_bytes).tolist(), rel=1e-12)
    if host != "none":
        got.sum().backward()
        assert (scale.grad[torch.unique(phase)] > 0).all()


def test_a_gpu_section_s_depthwise_law_moves_by_memory_bandwidth_to_the_gpu_borrowing_it():
    """A law is in seconds, not a fraction of a peak: the H100, which borrows the H200's section, gets the
    H200's law scaled by their bandwidths; the H200 itself and a CPU section get it as fitted. SYNTHETIC law."""
    law = {"forward:bf16": [-20.0, 0.9, 0.8, 0.9, 0.5], "backward:bf16": [-19.0, 1.0, 0.9, 1.0, 0.6]}
    section = {"fitted_on": "h200", "depthwise": law}
    h100, h200 = HARDWARE["h100"], HARDWARE["h200"]
    assert prior.profile_from_dict(h200, section).depthwise == {k: tuple(v) for k, v in law.items()}
    moved = prior.profile_from_dict(h100, section).depthwise
    ratio = h200.memory_bandwidth_Bps / h100.memory_bandwidth_Bps
    assert ratio > 1.3  # the H100 streams slower: its depthwise kernels take longer
    for key, c in law.items():
        assert moved[key][1:] == tuple(c[1:]) and math.isclose(math.exp(moved[key][0] - c[0]), ratio)
    cpu = prior.profile_from_dict(HARDWARE["cpu"], {"fitted_on": "cpu", "depthwise": law})
    assert cpu.depthwise == {k: tuple(v) for k, v in law.items()}


def test_calibrate_prior_fits_a_gpu_s_depthwise_law_only_when_asked():
    mod = calibrate_prior_module()
    gpu, cpu = HARDWARE["h200"], HARDWARE["cpu"]
    assert mod._depthwise_for(gpu, {"depthwise": True})["depthwise"] is False
    assert mod._depthwise_for(gpu, {"depthwise": True, "gpu_depthwise": True})["depthwise"] is True
    assert mod._depthwise_for(cpu, {"depthwise": True, "gpu_depthwise": False})["depthwise"] is True
    assert mod._depthwise_for(cpu, {"depthwise": False, "gpu_depthwise": True})["depthwise"] is False
    assert "gpu_depthwise" not in mod._depthwise_for(gpu, {"depthwise": True, "gpu_depthwise": True})


def test_calibrate_prior_fits_the_batch_norms_channel_ramp_on_a_gpu_only():
    """The shipped h100 section has the ramp (it passed its declared rule): a GPU fit has it unless
    --no-bn-channel-ramp, a CPU fit never (its batch norm runs on the thread that issues it)."""
    mod = calibrate_prior_module()
    gpu, cpu = HARDWARE["h200"], HARDWARE["cpu"]
    assert mod._depthwise_for(gpu, {"gpu_channel_ramp": True})["channel_ramp"] is True
    assert mod._depthwise_for(gpu, {"gpu_channel_ramp": False})["channel_ramp"] is False
    assert mod._depthwise_for(cpu, {"gpu_channel_ramp": True})["channel_ramp"] is False
    assert "gpu_channel_ramp" not in mod._depthwise_for(gpu, {"gpu_channel_ramp": True})
    assert prior.get_profile("h200").channel_ramp.keys() == set(prior.BATCH_NORM_OPS)
    assert prior.get_profile("h100").channel_ramp == prior.get_profile("h200").channel_ramp


def test_calibrate_prior_lofo_only_writes_nothing_and_refuses_write():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "calibrate_prior.py"
    for extra in (["--write"], ["--cpu"]):
        done = subprocess.run([sys.executable, str(script), "--profiles", "datasets/h200", "--lofo-only", *extra],
                              capture_output=True, text=True)
        assert done.returncode == 2 and "--lofo-only" in done.stderr.splitlines()[-1]


def test_a_calibration_section_fitted_to_fastest_labels_says_so(monkeypatch):
    """``calibrate_prior.py --labels fastest``: the steps are loaded with the fastest record's labels
    (``load_profiled`` passes them on), and the section it writes carries ``labels`` and says so in its
    source; a mean-label section keeps the form every shipped section had (no key). --labels without
    --profiles is refused (exit 2). The fitted curves are SYNTHETIC stand-ins."""
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from gnn_ptp import dataset, node_labels, prior_fit

    mod = calibrate_prior_module()
    asked = []
    monkeypatch.setattr(dataset, "measured_configs",
                        lambda d, label="mean": asked.append(label) or [SimpleNamespace(hardware="cpu")])
    monkeypatch.setattr(dataset, "load_graphs", lambda *a, **k: {})
    monkeypatch.setattr(dataset, "make_samples", lambda *a, **k: [])
    monkeypatch.setattr(node_labels, "node_seconds", lambda *a, **k: {})
    assert prior_fit.load_profiled("somewhere", label="fastest")[0].name == "cpu"
    assert asked == ["fastest"]
    fitted = {"gemm": {}, "vector": {}, "memory": {}, "device_floor_s": 1e-6}
    profile = SimpleNamespace(host_issue_s=(1e-5, 2e-5, 0.0), host_fixed_s=(0.0, 0.0, 0.0))
    hw = SimpleNamespace(kind="cpu", name="cpu")
    env = {"cpu_kind": "AMD EPYC", "torch": "2.14.1"}
    fastest = mod._section(hw, env, "fitted by X", "s", "c", fitted, profile, ["a"], {}, labels="fastest")
    mean = mod._section(hw, env, "fitted by X", "s", "c", fitted, profile, ["a"], {})
    assert fastest["labels"] == "fastest" and "fastest record" in fastest["source"]
    assert "labels" not in mean and mean["source"] == "fitted by X"
    # what predict quotes from such a section says what it predicts: the uncontended step
    shipped = {**prior.calibration()["cpu"], "expected_error": {"summary": "12 % step MAPE"}}
    assert prior.profile_from_dict(HARDWARE["cpu"], {**shipped, "labels": "fastest"}).expected_error["summary"] == (
        "12 % step MAPE, each step labelled by its configuration's fastest record (the uncontended step)")
    assert prior.profile_from_dict(HARDWARE["cpu"], {**shipped, "labels": "mean"}
                                   ).expected_error["summary"] == "12 % step MAPE"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "calibrate_prior.py"
    done = subprocess.run([sys.executable, str(script), "--cpu", "--labels", "fastest"], capture_output=True, text=True)
    assert done.returncode == 2 and "--labels fastest" in done.stderr.splitlines()[-1]
