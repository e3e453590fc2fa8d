"""Hardware descriptors (gnn_ptp/descriptor.py): datasheet GPUs, the measured CPU of this project, records
mapped to descriptors, the prior priced per descriptor. The "second CPU" here is SYNTHETIC (made-up rates,
named so): no record of another CPU kind exists in this repository."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from gnn_ptp import descriptor, ops, prior
from gnn_ptp.descriptor import DESCRIPTOR_FEATURES, Descriptor
from gnn_ptp.errors import UserError
from gnn_ptp.graph import NODE_FEATURES

from conftest import benchmark_module, calibrate_prior_module


def synthetic_cpu(factor: float = 0.5, name: str = "synthetic-slow-cpu") -> Descriptor:
    """A SYNTHETIC CPU: this project's measured CPU with every rate times ``factor`` (floor / factor)."""
    home = descriptor.stored_cpus()["amd-epyc"]
    return Descriptor(name, "cpu", {k: v * factor for k, v in home.gemm_flops_per_s.items()},
                      home.vector_flops_per_s * factor, home.memory_bandwidth_Bps * factor,
                      home.launch_floor_s / factor, "SYNTHETIC CPU for tests", "made up", measured=False,
                      curves="cpu")


def nodes(flops, moved, dtype="fp32", category="matmul", tc=False):
    """Node features of kernels with these FLOPs and bytes (graph.py's log2(1 + x) scale)."""
    n = len(flops)
    x = torch.zeros(n, NODE_FEATURES)
    x[:, 0] = torch.log2(1 + torch.tensor(flops, dtype=torch.float64)).float()
    x[:, 1] = torch.log2(1 + torch.tensor(moved, dtype=torch.float64)).float()
    x[:, prior.TC_COLUMN] = float(tc)
    x_cat = torch.zeros(n, 4, dtype=torch.long)
    x_cat[:, 1] = ops.CATEGORIES.index(category)
    x_cat[:, 2] = ops.DTYPES.index(dtype)
    return x, x_cat


def test_gpu_descriptors_are_the_datasheet_rates():
    g = descriptor.GPU_DESCRIPTORS
    assert g["h100"].gemm_flops_per_s["bf16"] == pytest.approx(989.4e12)
    assert g["h100"].gemm_flops_per_s["fp32"] == pytest.approx(67e12)
    assert g["h100"].memory_bandwidth_Bps == pytest.approx(3.35e12)
    assert g["h200"].memory_bandwidth_Bps == pytest.approx(4.8e12)
    assert g["h200"].gemm_flops_per_s == g["h100"].gemm_flops_per_s
    assert g["a100"].gemm_flops_per_s["bf16"] == pytest.approx(312e12)
    assert g["a100"].gemm_flops_per_s["tf32"] == pytest.approx(156e12)
    assert all(d.kind == "gpu" and not d.measured for d in g.values())


def test_this_cpu_s_descriptor_is_measured_and_stored_by_cpu_model():
    home = descriptor.stored_cpus()["amd-epyc"]
    stored = json.loads((descriptor.DESCRIPTOR_DIR / "amd-epyc.json").read_text())
    assert home.measured and home.kind == "cpu" and stored["extra"]["cpu_model"] == "AMD EPYC"
    assert home.gemm_flops_per_s["bf16"] > home.gemm_flops_per_s["fp32"] > home.vector_flops_per_s


@pytest.mark.parametrize("env, name", [
    ({"hardware": "cpu", "cpu_model": "AMD EPYC"}, "amd-epyc"),  # older records: the model name alone
    ({"hardware": "cpu", "cpu_model": "AMD EPYC", "cpu_kind": "AMD EPYC (family 26 model 2)"},
     "amd-epyc-family-26-model-2"),  # the kind, where recorded, tells generations of one name apart
    ({"hardware": "cpu", "cpu_model": "AMD EPYC", "cpu_kind": "AMD EPYC (family 25 model 17)"},
     "amd-epyc"),  # the first kind's machine type, identified later: its records take its earlier descriptor
    ({"hardware": "h100", "device_name": "NVIDIA H100 80GB HBM3"}, "h100"),
    ({"hardware": "h200", "device_name": "NVIDIA H200"}, "h200"),
    ({"hardware": "a100", "device_name": "NVIDIA A100-SXM4-80GB"}, "a100"),
    ({"hardware": "cpu"}, "cpu"),  # a record without a CPU model: the prior's reference CPU
])
def test_every_record_s_hardware_maps_to_a_descriptor(env, name):
    assert descriptor.for_env(env).name == name


def test_an_unmeasured_cpu_or_unknown_gpu_is_one_clear_error():
    with pytest.raises(UserError, match=r"no hardware descriptor for CPU 'Intel\(R\) Xeon\(R\) Gold 6342'.*"
                                        r"intel-r-xeon-r-gold-6342\.json.*--measure --write"):
        descriptor.for_env({"hardware": "cpu", "cpu_model": "Intel(R) Xeon(R) Gold 6342"})
    with pytest.raises(UserError, match="no hardware descriptor for device 'Tesla T4'.*h100"):
        descriptor.for_env({"hardware": "t4", "device_name": "Tesla T4"})


def test_a_descriptor_with_a_missing_or_bad_rate_is_refused():
    with pytest.raises(UserError, match="gemm bf16"):
        Descriptor("x", "cpu", {"fp32": 1e9, "tf32": 1e9, "fp16": 1e9}, 1e9, 1e9, 1e-6)
    with pytest.raises(UserError, match="memory_bandwidth_Bps"):
        Descriptor("x", "cpu", dict.fromkeys(descriptor.GEMM_DTYPES, 1e9), 1e9, -1.0, 1e-6)
    with pytest.raises(UserError, match="kind 'tpu'"):
        Descriptor("x", "tpu", dict.fromkeys(descriptor.GEMM_DTYPES, 1e9), 1e9, 1e9, 1e-6)


def test_features_are_log_scaled_rates_and_a_gpu_flag():
    h100, a100 = descriptor.GPU_DESCRIPTORS["h100"].features(), descriptor.GPU_DESCRIPTORS["a100"].features()
    cpu = descriptor.stored_cpus()["amd-epyc"].features()
    assert h100.shape == (1, DESCRIPTOR_FEATURES) and h100[0, -1] == 1 and cpu[0, -1] == 0
    # bf16 column: log10 ratio / 2 between two GPUs
    import math

    assert float(h100[0, 3] - a100[0, 3]) == pytest.approx(math.log10(989.4 / 312) / 2, rel=1e-5)
    assert float(cpu.abs().max()) < 3 and float(h100.abs().max()) < 3


def test_the_home_cpu_s_descriptor_prices_exactly_the_calibrated_prior():
    x, x_cat = nodes([1e3, 1e6, 1e9, 1e11], [1e3, 1e5, 1e7, 1e9])
    for dtype, category in (("fp32", "matmul"), ("bf16", "matmul"), ("fp32", "elementwise")):
        x_cat[:, 1], x_cat[:, 2] = ops.CATEGORIES.index(category), ops.DTYPES.index(dtype)
        mine = prior.node_seconds(x, x_cat, descriptor.stored_cpus()["amd-epyc"].profile())
        calibrated = prior.node_seconds(x, x_cat, prior.get_profile("cpu"))
        torch.testing.assert_close(mine, calibrated, rtol=1e-9, atol=0)
    h = descriptor.GPU_DESCRIPTORS["h100"].profile()
    torch.testing.assert_close(prior.node_seconds(x, x_cat, h), prior.node_seconds(x, x_cat, prior.get_profile("h100")))


def test_a_synthetic_cpu_at_half_the_rates_takes_twice_as_long_per_kernel():
    x, x_cat = nodes([1e6, 1e9, 1e11], [1e4, 1e6, 1e8])
    home = prior.node_seconds(x, x_cat, descriptor.stored_cpus()["amd-epyc"].profile())
    slow = prior.node_seconds(x, x_cat, synthetic_cpu(0.5).profile())
    torch.testing.assert_close(slow, 2 * home, rtol=1e-9, atol=0)


def test_a_cpu_kind_with_its_own_kernel_curves_uses_them(monkeypatch):
    """SYNTHETIC calibration table: a CPU kind whose own section (cpu-<name>) holds curves measured on it
    is priced with them at the reference peaks (its descriptor over itself); without the section it
    scales the reference CPU's curves by its measured rates."""
    import copy

    x, x_cat = nodes([1e6, 1e9, 1e11], [1e4, 1e6, 1e8])
    slow = synthetic_cpu(0.5, "synthetic-cpu-kind")
    scaled = prior.node_seconds(x, x_cat, slow.profile())
    table = copy.deepcopy(prior.calibration())
    own = copy.deepcopy(table["cpu"])
    own["cpu_model"] = "Synthetic CPU Kind"  # slug: synthetic-cpu-kind
    own["launch_floor_s"] = table["cpu"]["launch_floor_s"] * 3  # its own floor, unlike the scaled one
    table["cpu-synthetic-cpu-kind"] = own
    monkeypatch.setattr(prior, "calibration", lambda: table)
    stored = {"amd-epyc": descriptor.stored_cpus()["amd-epyc"], "synthetic-cpu-kind": slow}
    monkeypatch.setattr(descriptor, "stored_cpus", lambda folder=None: stored)
    mine = prior.node_seconds(x, x_cat, slow.profile())
    reference = prior.node_seconds(x, x_cat, prior.profile_from_dict(prior.HARDWARE["cpu"], own))
    torch.testing.assert_close(mine, reference, rtol=1e-9, atol=0)
    assert not torch.allclose(mine, scaled)


def test_a_residual_s_cpu_kind_is_priced_over_the_training_kind_s_prior_moved_not_its_own(monkeypatch):
    """SYNTHETIC calibration table: for ``predict --cpu-kind`` with a residual checkpoint, a CPU kind that
    has its own section is still priced by the training kind's prior moved to it (``MovedPrior``), the
    prior the residual was learned over; its features and name are its own."""
    import copy

    x, x_cat = nodes([1e6, 1e9, 1e11], [1e4, 1e6, 1e8])
    home, slow = descriptor.stored_cpus()["amd-epyc"], synthetic_cpu(0.5, "synthetic-cpu-kind")
    table = copy.deepcopy(prior.calibration())
    own = copy.deepcopy(table["cpu"])
    own["cpu_model"] = "Synthetic CPU Kind"
    own["launch_floor_s"] = table["cpu"]["launch_floor_s"] * 3
    table["cpu-synthetic-cpu-kind"] = own
    monkeypatch.setattr(prior, "calibration", lambda: table)
    moved = descriptor.MovedPrior(home, slow)
    assert moved.name == slow.name and torch.equal(moved.features(), slow.features())
    expected = prior.node_seconds(x, x_cat, descriptor.transfer(home.profile(), home, slow))
    torch.testing.assert_close(prior.node_seconds(x, x_cat, moved.profile()), expected, rtol=1e-9, atol=0)
    assert not torch.allclose(prior.node_seconds(x, x_cat, slow.profile()), expected)  # its own section differs


def test_attach_gives_each_sample_its_hardware_s_features_and_prior():
    from torch_geometric.data import Data

    x, x_cat = nodes([1e6, 1e9], [1e4, 1e6])
    a = Data(x=x, x_cat=x_cat, phase=torch.tensor([0, 1]))
    b = Data(x=x.clone(), x_cat=x_cat.clone(), phase=torch.tensor([0, 1]))
    home, slow = descriptor.stored_cpus()["amd-epyc"], synthetic_cpu(0.25)
    descriptor.attach([a, b], [home, slow])
    assert torch.equal(a.hw, home.features()) and torch.equal(b.hw, slow.features())
    torch.testing.assert_close(b.prior_log_ms - a.prior_log_ms, torch.full((2,), float(torch.log(torch.tensor(4.0)))))
    assert (a.hardware_name, b.hardware_name) == ("amd-epyc", "synthetic-slow-cpu")


def test_descriptors_are_read_from_a_folder_keyed_by_cpu_model(tmp_path, monkeypatch):
    shutil.copy(descriptor.DESCRIPTOR_DIR / "amd-epyc.json", tmp_path / "amd-epyc.json")
    path = descriptor.write(synthetic_cpu(0.5, "synthetic-cpu-model-x"), tmp_path)
    assert path.name == "synthetic-cpu-model-x.json"
    monkeypatch.setattr(descriptor, "DESCRIPTOR_DIR", tmp_path)
    found = descriptor.for_env({"hardware": "cpu", "cpu_model": "Synthetic CPU Model X"})
    assert found == synthetic_cpu(0.5, "synthetic-cpu-model-x")


def test_measure_cpu_returns_positive_ceilings_named_by_this_cpu(monkeypatch):
    d = descriptor.measure_cpu(threads=1, sizes=(64, 128), layout_sizes=(64,))
    assert d.kind == "cpu" and d.measured and d.name == descriptor.stored_name(descriptor.cpu_model())
    assert set(d.gemm_layout_flops_per_s) == {"fp32", "bf16", "fp16"}
    assert all(set(r) == {"nn", "nt", "tn", "tt"} and min(r.values()) > 0 for r in d.gemm_layout_flops_per_s.values())
    assert all(v > 0 for v in d.gemm_flops_per_s.values())
    assert d.gemm_flops_per_s["tf32"] == d.gemm_flops_per_s["fp32"]
    assert d.memory_bandwidth_Bps > 1e8 and 0 < d.launch_floor_s < 1e-3
    assert torch.get_num_threads() >= 1


def test_cli_lists_descriptors_and_refuses_write_without_measure(capsys):
    assert descriptor.main([]) == 0
    out = capsys.readouterr().out
    assert "h100" in out and "amd-epyc" in out and "datasheet" in out
    assert descriptor.main(["--write"]) == 2
    assert "--write needs --measure" in capsys.readouterr().err


def test_several_measurements_of_one_cpu_become_the_median_of_each_rate_probe_and_fresh_cost(capsys):
    """SYNTHETIC runs (made-up rates, one burst of load in the second): every rate, probe and fresh-allocation
    figure is the median of the three, each run's ceilings are kept, and other kinds' runs are refused."""
    from dataclasses import replace

    base = synthetic_cpu(1.0)

    def run(factor, probe_s, fresh_ms, source):
        return replace(base, gemm_flops_per_s={k: v * factor for k, v in base.gemm_flops_per_s.items()},
                       vector_flops_per_s=base.vector_flops_per_s * factor,
                       memory_bandwidth_Bps=base.memory_bandwidth_Bps * factor,
                       launch_floor_s=base.launch_floor_s / factor, source=source,
                       step_probe_s={"gemm fp32": {"a": probe_s, "b": 2 * probe_s}}, probe_suite="step-probes-1",
                       fresh_alloc={"threshold_bytes": 33423360, "ms_per_MiB": fresh_ms, "rows": [fresh_ms]})

    runs = [run(1.0, 0.010, 0.30, "run 1"), run(0.5, 0.030, 0.90, "run 2 (loaded)"), run(1.1, 0.009, 0.28, "run 3")]
    d = descriptor.median_of(runs)
    assert d.gemm_flops_per_s["bf16"] == pytest.approx(base.gemm_flops_per_s["bf16"])
    assert d.vector_flops_per_s == pytest.approx(base.vector_flops_per_s)
    assert d.launch_floor_s == pytest.approx(base.launch_floor_s)
    assert d.step_probe_s == {"gemm fp32": {"a": pytest.approx(0.010), "b": pytest.approx(0.020)}}
    assert d.fresh_alloc["ms_per_MiB"] == pytest.approx(0.30) and d.fresh_alloc["rows"] == [0.30]
    assert [r["source"] for r in d.extra["runs"]] == ["run 1", "run 2 (loaded)", "run 3"]
    assert d.source.startswith("median of 3 runs") and "run 1" in d.source
    assert descriptor.median_of(runs[:1]) is runs[0]
    with pytest.raises(UserError, match="one CPU kind's"):
        descriptor.median_of([runs[0], replace(runs[1], name="another-cpu")])
    assert descriptor.main(["--runs", "0", "--measure"]) == 2
    assert "--runs 0: a whole number >= 1" in capsys.readouterr().err
    assert descriptor.main(["--runs", "3"]) == 2
    assert "more than 1 only with --measure" in capsys.readouterr().err


def test_records_name_the_cpu_kind_and_cpu_kinds_get_their_own_folders(tmp_path):
    """A CPU record carries its kind (model name + family and model numbers, where /proc/cpuinfo has
    them); the collector takes datasets/cpu or datasets/cpu-<kind> on a CPU, and refuses other names."""
    from gnn_ptp import records
    from gnn_ptp.collect import CollectConfig, collect

    env = records.environment(torch.device("cpu"))
    kind = records._cpu_kind()
    assert env["cpu_kind"] == kind
    if kind is not None:
        assert kind.startswith(env["cpu_model"]) and "family" in kind
        if descriptor.stored_name(kind) in descriptor.stored_cpus():  # measured here: found by kind, not by name
            assert descriptor.for_env(env).name == descriptor.stored_name(kind)
    with pytest.raises(UserError, match="folder named 'cpu'.*cpu-<kind>"):
        collect(CollectConfig(grid="training/grids/cpu.toml", out=tmp_path / "gpu-things", device="cpu", limit=1))


def test_a_cpu_kind_s_host_costs_move_with_its_measured_dispatch_floor():
    """The reference CPU's host issue and fixed costs (fitted to its profiled steps) priced for a SYNTHETIC
    CPU with every rate halved (its dispatch floor doubled): Python and the dispatcher run on that core."""
    home = descriptor.stored_cpus()["amd-epyc"]
    reference = home.profile()
    assert reference.host_issue_s, "the cpu section is fitted to profiled steps (calibrate_prior --profiles)"
    slow = synthetic_cpu(0.5).profile()
    ratio = synthetic_cpu(0.5).launch_floor_s / home.launch_floor_s
    assert ratio == pytest.approx(2.0)
    assert slow.host_issue_s == pytest.approx(tuple(h * ratio for h in reference.host_issue_s))
    assert slow.host_fixed_s == pytest.approx(tuple(h * ratio for h in reference.host_fixed_s))
    assert slow.serial and reference.serial


def test_a_cpu_profile_fit_writes_the_reference_section_or_the_kind_s_own():
    """benchmarks/calibrate_prior.py --profiles on a CPU folder: the reference CPU's fit is section "cpu"
    (whose curves other kinds scale), another kind's is "cpu-<kind>", which its descriptor then prefers."""
    module = calibrate_prior_module()
    table = {"cpu": {"cpu_model": "AMD EPYC"}}
    assert module.cpu_section_name("AMD EPYC", table) == "cpu"
    assert module.cpu_section_name("AMD EPYC (family 26 model 2)", table) == "cpu-amd-epyc-family-26-model-2"
    assert module.cpu_section_name("Intel Xeon", {}) == "cpu"  # the first CPU fitted becomes the reference
    # the reference kind's machine type under the name its records give now: still the reference section
    assert module.cpu_section_name("AMD EPYC (family 25 model 17)", table) == "cpu"


def test_a_kind_identified_later_takes_its_earlier_descriptor_and_keeps_its_measured_ceilings(monkeypatch, capsys):
    """``SAME_KIND``: the first kind's records say "AMD EPYC"; its machine type, identified later by its
    family and model numbers, maps to that descriptor everywhere a CPU is named (``--cpu-kind`` by slug or
    "this"), and ``--measure --write`` there refuses (one line, exit 2) rather than replace the ceilings the
    shipped prior and checkpoint were fitted with; other kinds keep their own slugs."""
    from gnn_ptp import prediction

    assert descriptor.stored_name("AMD EPYC (family 25 model 17)") == "amd-epyc"
    assert descriptor.stored_name("amd-epyc-family-25-model-17") == "amd-epyc"
    assert descriptor.stored_name("AMD EPYC (family 25 model 1)") == "amd-epyc-family-25-model-1"
    assert set(descriptor.SAME_KIND.values()) <= set(descriptor.stored_cpus())
    assert not set(descriptor.SAME_KIND) & set(descriptor.stored_cpus())  # no second file shadows the first
    assert prediction._stored_cpu_name("amd-epyc-family-25-model-17") == "amd-epyc"
    monkeypatch.setattr(descriptor, "cpu_model", lambda: "AMD EPYC (family 25 model 17)")
    assert prediction._stored_cpu_name("this") == "amd-epyc"
    measured = []
    monkeypatch.setattr(descriptor, "measure_cpu", lambda *a, **k: measured.append(1))
    assert descriptor.main(["--measure", "--write"]) == 2
    err = capsys.readouterr().err
    assert not measured and len(err.strip().splitlines()) == 1
    assert "stored as 'amd-epyc'" in err and "--probes, --fresh or --layouts" in err


def test_two_calibration_runs_side_by_side_keep_each_other_s_section(tmp_path):
    """Two ``calibrate_prior.py --write`` runs that read the same file and finish one after the other
    (SYNTHETIC sections): the second writes its own section into the file as the first left it."""
    import json

    module = calibrate_prior_module()
    file = tmp_path / "prior_calibration.json"
    file.write_text(json.dumps({"cpu": {"v": 1}, "cpu-b": {"v": 1}, "h100": {"v": 1}}))
    first, second = json.loads(file.read_text()), json.loads(file.read_text())
    before = json.loads(file.read_text())
    first["cpu"], second["cpu-b"] = {"v": 2}, {"v": 3}
    module.write_sections(first, before, file)
    module.write_sections(second, before, file)
    assert json.loads(file.read_text()) == {"cpu": {"v": 2}, "cpu-b": {"v": 3}, "h100": {"v": 1}}


def test_the_ceiling_gap_is_the_largest_rate_ratio_a_transfer_crosses():
    home = descriptor.stored_cpus()["amd-epyc"]
    assert descriptor.ceiling_gap(home, home) == 0
    assert descriptor.ceiling_gap(home, synthetic_cpu(0.5)) == pytest.approx(math.log10(2))
    assert descriptor.ceiling_gap(synthetic_cpu(4.0), synthetic_cpu(0.5)) == pytest.approx(math.log10(8))
    slow_bf16 = Descriptor("x", "cpu", {**home.gemm_flops_per_s, "bf16": home.gemm_flops_per_s["bf16"] / 7},
                           home.vector_flops_per_s, home.memory_bandwidth_Bps, home.launch_floor_s)
    assert descriptor.ceiling_gap(home, slow_bf16) == pytest.approx(math.log10(7))


def test_a_slow_path_convolution_law_stays_on_the_kind_it_was_fitted_on():
    """A SYNTHETIC slow-path convolution law (``prior.Profile.slow_conv``: a code path torch takes on the
    source kind, bf16 convolutions one sample at a time) prices the source's node; moved to another kind,
    by the ceilings or split, the law is dropped and the node is priced by the curves, as a profile without
    it would be; moved to the same kind it stays."""
    from dataclasses import replace

    home, slow = synthetic_cpu(1.0, "synthetic-home-cpu"), synthetic_cpu(0.5)
    law = {"forward:bf16": (1e-4, 1e-9, 0.0, 0.0, 1e-8, 0.0)}
    plain = prior.Profile(home.hardware(), launch_floor_s=1e-9)
    profile = replace(plain, slow_conv=law)
    x, x_cat = nodes([2.0 * 8 * 64 * 56 * 56 * 9 * 64], [8 * 64 * 56 * 56 * 4 * 2.0], category="conv")
    x_cat[:, 2] = ops.DTYPE_ID["bf16"]
    x[:, 8:12] = torch.log2(1 + torch.tensor([8.0, 64, 56, 56]))  # a dense 3x3, 64 -> 64 channels
    x[:, 4:8] = x[:, 8:12]
    terms = prior.slow_conv_terms(x, x_cat)
    at_home = prior.slow_conv_seconds(terms, torch.tensor([False]), ["bf16"], law)
    torch.testing.assert_close(prior.node_seconds(x, x_cat, profile), at_home)
    assert descriptor.transfer(profile, home, home).slow_conv == law
    for mode in ("ceilings", "split"):
        moved = descriptor.transfer(profile, home, slow, mode=mode)
        assert not moved.slow_conv and (moved.moved_from is None or not moved.moved_from[0].slow_conv)
        torch.testing.assert_close(prior.node_seconds(x, x_cat, moved),
                                   prior.node_seconds(x, x_cat, descriptor.transfer(plain, home, slow, mode=mode)))


def test_a_depthwise_law_moves_by_the_non_gemm_ratio_or_is_split_like_any_kernel():
    """A SYNTHETIC depthwise law (seconds, not a fraction of a peak) on a prior moved to a kind at half
    every rate: by the ceilings its times double (the non-GEMM ratio); split, the source prices the node by
    the law and the split moves it (``prior.split_moved_seconds``)."""
    from dataclasses import replace

    home, slow = synthetic_cpu(1.0, "synthetic-home-cpu"), synthetic_cpu(0.5)
    law = {"forward:fp32": (-11.0, 0.3, 0.2, 0.25, 0.0), "backward:fp32": (-14.0, 0.7, 0.55, 0.3, 0.9)}
    profile = replace(prior.Profile(home.hardware(), launch_floor_s=1e-9), depthwise=law)
    x, x_cat = nodes([2.0 * 8 * 64 * 56 * 56 * 9], [8 * 64 * 56 * 56 * 4 * 2.0], category="conv")
    x[:, 8:12] = torch.log2(1 + torch.tensor([8.0, 64, 56, 56]))  # the input, [N, C, H, W]
    x[:, 4:8] = x[:, 8:12]  # a stride-1 depthwise 3x3: the output as the input
    shapes = prior.depthwise_shapes(x, x_cat)
    assert shapes[0].tolist() == [8.0, 64.0, 56.0 * 56.0, 9.0, 1.0]
    at_home = prior.depthwise_law_seconds(shapes, torch.tensor([False]), ["fp32"], law)
    torch.testing.assert_close(prior.node_seconds(x, x_cat, profile), at_home)
    moved = descriptor.transfer(profile, home, slow, mode="ceilings")
    torch.testing.assert_close(prior.node_seconds(x, x_cat, moved), 2 * at_home)
    split = descriptor.transfer(profile, home, slow, mode="split")
    assert split.moved_from is not None
    source_s, (source_ideal, target_ideal) = prior._kernel_seconds(x, x_cat, profile, home.hardware(), slow.hardware())
    torch.testing.assert_close(source_s, at_home)
    torch.testing.assert_close(prior.node_seconds(x, x_cat, split),
                               prior.split_moved_seconds(at_home, source_ideal, target_ideal, 0.5))


def with_probes(d: Descriptor, seconds: dict[str, float], suite: str = descriptor.PROBE_SUITE) -> Descriptor:
    """``d`` with SYNTHETIC step-probe seconds: every probe of a group the given seconds (two probes a group)."""
    from dataclasses import replace

    return replace(d, probe_suite=suite, step_probe_s={g: {"a": s, "b": s * 3} for g, s in seconds.items()})


def test_step_probes_not_the_peaks_move_a_prior_where_both_kinds_measured_them():
    """Two SYNTHETIC CPUs whose ceilings say 4x apart but whose step-sized probes say the target runs fp32
    GEMMs 1.5x, bf16 GEMMs 1.2x faster and non-GEMM kernels 2x / 0.5x (geometric mean 1x): the probes set
    the ratios a prior moves by; fp16 (no probe) keeps the ceilings'; a kind without probes, or of another
    suite, falls back to the ceilings."""
    fast, home = synthetic_cpu(4.0, "synthetic-fast-cpu"), synthetic_cpu(1.0, "synthetic-home-cpu")
    src = with_probes(home, {"gemm fp32": 3e-3, "gemm bf16": 2.4e-3, "non-gemm fp32": 2e-3, "non-gemm bf16": 1e-3})
    tgt = with_probes(fast, {"gemm fp32": 2e-3, "gemm bf16": 2e-3, "non-gemm fp32": 1e-3, "non-gemm bf16": 2e-3})
    assert descriptor.probes_shared(src, tgt)
    ratios = descriptor.transfer_ratios(src, tgt)
    assert ratios["fp32"] == pytest.approx(1.5) and ratios["tf32"] == pytest.approx(1.5)
    assert ratios["bf16"] == pytest.approx(1.2)
    assert ratios["vector"] == pytest.approx(1.0) and ratios["memory"] == pytest.approx(1.0)
    assert ratios["fp16"] == pytest.approx(4.0)
    for other in (fast, with_probes(fast, {g: 1e-3 for g in descriptor.PROBE_GROUPS}, suite="step-probes-0")):
        assert not descriptor.probes_shared(src, other)
        assert descriptor.transfer_ratios(src, other) == pytest.approx(
            {**{d: 4.0 for d in descriptor.GEMM_DTYPES}, "vector": 4.0, "memory": 4.0})
    profile = prior.Profile(src.hardware(), launch_floor_s=src.launch_floor_s)
    moved = descriptor.transfer(profile, src, tgt, mode="split")  # one ratio per group ("sized": by size)
    assert moved.moved_from is None and moved.sized_from is None
    assert moved.hardware.flops_per_s["bf16"] == pytest.approx(src.gemm_flops_per_s["bf16"] * 1.2)
    assert moved.hardware.memory_bandwidth_Bps == pytest.approx(src.memory_bandwidth_Bps)
    assert descriptor.Descriptor.from_dict(json.loads(json.dumps(tgt.to_dict()))) == tgt


def test_step_probes_are_measured_per_group_and_added_to_this_cpu_s_descriptor_keeping_its_ceilings(
        monkeypatch, capsys, tmp_path):
    probes = descriptor.measure_step_probes(threads=1, passes=1)
    assert set(probes) == set(descriptor.PROBE_GROUPS)
    assert probes["gemm fp32"].keys() == probes["gemm bf16"].keys() and len(probes["gemm fp32"]) >= 10
    assert all(0 < s < 1 for group in probes.values() for s in group.values())

    here = descriptor.stored_name(descriptor.cpu_model())
    stored = Descriptor(here, "cpu", {d: 1e11 for d in descriptor.GEMM_DTYPES}, 1e10, 2e10, 2e-6,
                        source="SYNTHETIC ceilings, measured 2026-01-01")
    monkeypatch.setattr(descriptor, "measure_step_probes", lambda threads=1, log=None: probes)
    added = descriptor.with_step_probes(stored)
    assert added.gemm_flops_per_s == stored.gemm_flops_per_s and added.step_probe_s == probes
    assert added.probe_suite == descriptor.PROBE_SUITE
    assert added.source.startswith("SYNTHETIC ceilings, measured 2026-01-01; step probes (")
    # --runs N: each probe's median over N measurements (SYNTHETIC: the runs scale every probe by 1, 3, 2)
    scales = iter((1.0, 3.0, 2.0))

    def scaled_probes(threads=1, log=None):
        k = next(scales)
        return {g: {name: t * k for name, t in group.items()} for g, group in probes.items()}

    monkeypatch.setattr(descriptor, "measure_step_probes", scaled_probes)
    median = descriptor.with_step_probes(stored, runs=3)
    assert median.step_probe_s == {g: {name: t * 2.0 for name, t in group.items()} for g, group in probes.items()}
    assert "the median of 3 runs" in median.source
    monkeypatch.setattr(descriptor, "measure_step_probes", lambda threads=1, log=None: probes)
    with pytest.raises(UserError, match="not this CPU's"):
        descriptor.with_step_probes(synthetic_cpu(1.0))

    monkeypatch.setattr(descriptor, "DESCRIPTOR_DIR", tmp_path)  # no stored descriptor for this CPU there
    monkeypatch.setattr(descriptor, "stored_cpus", lambda folder=None: {})
    assert descriptor.main(["--probes"]) == 2
    err = capsys.readouterr().err
    assert "--probes: no stored descriptor" in err and "--measure --write" in err


def test_transfer_sources_refuses_folders_it_cannot_compare(tmp_path):
    """benchmarks/transfer_sources.py compares the same grid profiled on two kinds: an empty folder, or two
    folders with no configuration in common, get one line naming them (the script exits 2 on it)."""
    module = benchmark_module("transfer_sources")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no usable records .*empty"):
        module.main(["--source", "datasets/cpu", "--target", str(tmp_path / "empty")])
    with pytest.raises(UserError, match="share no configuration"):
        module.main(["--source", "datasets/cpu", "--target", "datasets/h200-blind"])
    with pytest.raises(UserError, match="--mode splitt: allowed: ceilings, split"):
        module.main(["--source", "datasets/cpu", "--target", "datasets/cpu", "--mode", "splitt"])


MiB = 2 ** 20


def with_fresh(d: Descriptor, ms_per_mib: float, threshold: int = 32 * MiB) -> Descriptor:
    """``d`` with a SYNTHETIC fresh-allocation cost."""
    from dataclasses import replace

    return replace(d, fresh_alloc={"threshold_bytes": threshold, "ms_per_MiB": ms_per_mib, "source": "SYNTHETIC"})


def test_fresh_allocations_above_the_threshold_cost_their_page_faults_per_byte():
    """A prior with a fresh-allocation cost adds it per kernel for each allocation above the threshold
    (the largest, and the rest where it is itself above: a second large output); a graph that does not
    say what it allocates, or a profile without the cost, is priced as before."""
    from dataclasses import replace

    src = with_fresh(synthetic_cpu(1.0, "synthetic-a"), 0.25)
    assert src.fresh() == {"threshold_bytes": 32 * MiB, "s_per_byte": pytest.approx(0.25e-3 / MiB)}
    assert synthetic_cpu(1.0).fresh() is None
    assert with_fresh(synthetic_cpu(1.0), 0.0).fresh() is None  # measured, nothing costly
    profile = replace(prior.Profile(src.hardware()), fresh_threshold_bytes=32 * MiB, fresh_s_per_byte=1e-9)
    x, x_cat = nodes([1e3] * 4, [1e3] * 4, category="elementwise")
    fresh = torch.tensor([[64 * MiB, 64 * MiB], [16 * MiB, 16 * MiB], [100 * MiB, 60 * MiB], [0, 0]],
                         dtype=torch.float64)
    plain = prior.node_seconds(x, x_cat, prior.Profile(src.hardware()), fresh)
    got = prior.node_seconds(x, x_cat, profile, fresh)
    assert (got - plain).tolist() == pytest.approx([64 * MiB * 1e-9, 0.0, 100 * MiB * 1e-9, 0.0])
    assert torch.equal(prior.node_seconds(x, x_cat, profile), plain)

    # moved to another kind: that kind's measured cost, or none where it has no measurement
    tgt = with_fresh(synthetic_cpu(0.5, "synthetic-b"), 0.5)
    assert descriptor.transfer(profile, src, tgt).fresh_s_per_byte == pytest.approx(0.5e-3 / MiB)
    unmeasured = descriptor.transfer(profile, src, synthetic_cpu(0.5, "synthetic-c"))
    assert unmeasured.fresh_threshold_bytes is None and unmeasured.fresh_s_per_byte == 0.0
    # a prior fitted without the cost (its curves hold it) does not take one on
    assert descriptor.transfer(prior.Profile(src.hardware()), src, tgt).fresh_threshold_bytes is None
    assert Descriptor.from_dict(json.loads(json.dumps(tgt.to_dict()))) == tgt


def test_the_fresh_allocation_cost_is_measured_in_one_process_and_added_to_this_cpu_s_descriptor(
        monkeypatch, capsys, tmp_path):
    """``measure_fresh`` outside a process group times this process alone (a made-up allocator here: the
    timing is replaced); ``--fresh --write`` adds it to this CPU's stored descriptor, keeping the rest."""
    from gnn_ptp import fsdp_overheads

    monkeypatch.setattr(fsdp_overheads, "_fresh_extra_ms",
                        lambda nbytes, agree, reps=9: agree({"extra": 0.3 * nbytes / MiB if nbytes > 40 * MiB
                                                             else 0.0})["extra"])
    got = descriptor.measure_fresh_alloc()
    assert 32 * MiB <= got["threshold_bytes"] <= 40 * MiB and got["ms_per_MiB"] == pytest.approx(0.3)
    here = descriptor.stored_name(descriptor.cpu_model())
    stored = Descriptor(here, "cpu", {d: 1e11 for d in descriptor.GEMM_DTYPES}, 1e10, 2e10, 2e-6,
                        source="SYNTHETIC ceilings")
    added = descriptor.with_fresh_alloc(stored)
    assert added.gemm_flops_per_s == stored.gemm_flops_per_s and added.fresh_alloc["ms_per_MiB"] == pytest.approx(0.3)
    with pytest.raises(UserError, match="not this CPU's"):
        descriptor.with_fresh_alloc(synthetic_cpu(1.0))
    monkeypatch.setattr(descriptor, "stored_cpus", lambda folder=None: {})
    assert descriptor.main(["--fresh"]) == 2
    assert "--fresh: no stored descriptor" in capsys.readouterr().err


def test_a_kind_s_fresh_allocation_cost_can_come_from_its_gloo_profile_s_two_rank_figure(monkeypatch, capsys):
    """``--fresh-from-gloo NAME``: the stored descriptor takes the 2-rank FSDP fresh-buffer figure of the
    shipped gloo profile measured on its kind (not the 4-rank one, whose ranks share two cores), with a
    source saying so; a kind without such a profile, or a profile without the figure, is refused in one
    line."""
    from dataclasses import replace

    from gnn_ptp import interconnect

    name = "amd-epyc-family-26-model-2"
    profile = interconnect.builtin()[f"cpu-gloo-{name}"]
    measured = profile.fsdp["2"]["fresh"]
    stored = replace(descriptor.stored_cpus()[name], fresh_alloc={})
    got = descriptor.fresh_alloc_from_gloo(stored)
    assert got.fresh_alloc["ms_per_MiB"] == measured["ms_per_MiB"] != profile.fsdp["4"]["fresh"]["ms_per_MiB"]
    assert got.fresh_alloc["threshold_bytes"] == measured["threshold_bytes"]
    assert f"2-rank FSDP fresh-buffer figure of gloo profile cpu-gloo-{name}" in got.fresh_alloc["source"]
    assert got.fresh() == {"threshold_bytes": float(measured["threshold_bytes"]),
                           "s_per_byte": pytest.approx(measured["ms_per_MiB"] * 1e-3 / MiB)}
    assert replace(got, fresh_alloc={}) == stored  # nothing else changes
    with pytest.raises(UserError, match="no shipped gloo profile 'cpu-gloo-synthetic-slow-cpu'"):
        descriptor.fresh_alloc_from_gloo(synthetic_cpu(1.0))
    four_only = replace(profile, name="cpu-gloo-synthetic-slow-cpu", fsdp={"4": profile.fsdp["4"]})
    monkeypatch.setattr(interconnect, "builtin", lambda: {four_only.name: four_only})
    with pytest.raises(UserError, match="has no 2-rank fresh-buffer figure"):
        descriptor.fresh_alloc_from_gloo(synthetic_cpu(1.0))
    monkeypatch.undo()
    assert descriptor.main(["--fresh-from-gloo", "no-such-cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--fresh-from-gloo no-such-cpu: no stored CPU descriptor" in err
    assert descriptor.main(["--fresh-from-gloo", name, "--fresh"]) == 2
    assert "measures nothing" in capsys.readouterr().err
    assert descriptor.main(["--fresh-from-gloo", name]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["fresh_alloc"]["ms_per_MiB"] == measured["ms_per_MiB"]


def with_ceilings(d: Descriptor, name: str, **factors) -> Descriptor:
    """``d`` renamed, with SYNTHETIC ceilings: each named GEMM dtype's rate (``bf16=7``), ``vector`` or
    ``memory`` times its factor."""
    from dataclasses import replace

    rates = {k: v * factors.get(k, 1.0) for k, v in d.gemm_flops_per_s.items()}
    return replace(d, name=name, gemm_flops_per_s=rates,
                   vector_flops_per_s=d.vector_flops_per_s * factors.get("vector", 1.0),
                   memory_bandwidth_Bps=d.memory_bandwidth_Bps * factors.get("memory", 1.0))


def test_split_moved_seconds_moves_the_time_at_the_ceilings_by_them_and_the_rest_by_its_ratio():
    """SYNTHETIC times: 10 s priced against 1 s at the source's ceilings and 0.5 s at the target's, the
    rest 2x faster there: 0.5 + 9 / 2; a kernel priced at or under its ceilings' time moves by them."""
    got = prior.split_moved_seconds(torch.tensor([10.0, 0.5, 0.0], dtype=torch.float64),
                                    torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64),
                                    torch.tensor([0.5, 0.25, 0.0], dtype=torch.float64), 2.0)
    assert got.tolist() == pytest.approx([5.0, 0.125, 0.0])


def test_a_split_transfer_moves_small_gemms_by_the_core_and_large_ones_by_the_peak():
    """Two SYNTHETIC CPU kinds alike but for a 7x bf16 GEMM peak (a matrix unit) on the target. Moved by the
    ceilings, every bf16 GEMM runs 7x faster; split, a small GEMM far below the source's peak keeps its
    time (the rest of it moves by the non-GEMM ratio, 1 here) and one at its peak runs 7x faster. The same
    kind, or kinds sharing step probes, are moved as before; two moves compose; a bad mode is one line."""
    from dataclasses import replace

    src = synthetic_cpu(1.0, "synthetic-home-cpu")
    tgt = with_ceilings(src, "synthetic-amx-cpu", bf16=7.0)
    peak = src.gemm_flops_per_s["bf16"]
    profile = prior.Profile(src.hardware(), gemm={"bf16": prior.Curve(1.0, 1e9, 1.0)},
                            launch_floor_s=1e-9)
    x, x_cat = nodes([1e7, 1e13], [1e3, 1e3], dtype="bf16")
    before = prior.node_seconds(x, x_cat, profile)
    by_ceilings = prior.node_seconds(x, x_cat, descriptor.transfer(profile, src, tgt, mode="ceilings"))
    assert (before / by_ceilings).tolist() == pytest.approx([7.0, 7.0])
    split = descriptor.transfer(profile, src, tgt, mode="split")
    assert split.moved_from is not None and split.moved_from[3] == pytest.approx(1.0)
    moved = prior.node_seconds(x, x_cat, split)
    small_ideal = 1e7 / peak
    assert moved[0] == pytest.approx(small_ideal / 7 + float(before[0]) - small_ideal)
    assert float(before[0] / moved[0]) < 1.01
    assert float(before[1] / moved[1]) == pytest.approx(7 * (1 + 1e-4) / (1 + 7e-4), rel=1e-6)

    # the rest moves by the geometric mean of the element-wise and bandwidth ratios
    slow = with_ceilings(src, "synthetic-slow-core", vector=0.5, memory=0.125)
    assert descriptor.transfer(profile, src, slow, mode="split").moved_from[3] == pytest.approx(0.25)
    # two moves compose: home -> AMX -> slow core prices a kernel above its ceilings as home -> slow core
    twice = descriptor.transfer(split, tgt, slow, mode="split")
    once = descriptor.transfer(profile, src, slow, mode="split")
    assert prior.node_seconds(x, x_cat, twice).tolist() == pytest.approx(prior.node_seconds(x, x_cat, once).tolist())

    assert descriptor.transfer(profile, src, src, mode="split").moved_from is None
    probes = {g: 1e-3 for g in descriptor.PROBE_GROUPS}
    assert descriptor.transfer(profile, with_probes(src, probes), with_probes(tgt, probes),
                               mode="split").moved_from is None
    gpu = descriptor.GPU_DESCRIPTORS
    assert descriptor.transfer(replace(profile, hardware=gpu["h100"].hardware()), gpu["h100"], gpu["h200"],
                               mode="split").moved_from is None
    with pytest.raises(UserError, match="hardware transfer mode 'splt': allowed: ceilings, split"):
        descriptor.transfer(profile, src, tgt, mode="splt")
    with pytest.raises(UserError, match="cannot move on"):
        descriptor.transfer(split, tgt, src, mode="ceilings")


def test_transfer_prior_refuses_what_it_cannot_compare(tmp_path):
    """benchmarks/transfer_prior.py needs two CPU folders or more and known modes: one line each."""
    module = benchmark_module("transfer_prior")
    with pytest.raises(UserError, match="--modes ceiling: allowed: ceilings, split"):
        module.main(["--data", "datasets/cpu", "datasets/h200-blind", "--modes", "ceiling"])
    with pytest.raises(UserError, match="needs two folders or more"):
        module.main(["--data", "datasets/cpu"])
    with pytest.raises(UserError, match="not a CPU kind"):
        module.main(["--data", "datasets/cpu", "datasets/h200-blind"])


def test_gemm_layout_rates_become_ratios_over_nn_that_a_transfer_carries_to_the_target(monkeypatch, capsys):
    """SYNTHETIC per-layout rates: the hardware of a descriptor with them says how much faster each layout
    runs than nn (tf32 as fp32), one without says nothing (1); a prior moved onto a kind takes that kind's
    ratios; several runs give the median; ``--layouts`` adds them to this CPU's stored descriptor only."""
    from dataclasses import replace

    rates = {"bf16": {"nn": 1e9, "nt": 7e9, "tn": 18e9, "tt": 1e9}, "fp32": {"nn": 8e10, "nt": 8e10, "tn": 4e10, "tt": 8e10}}
    slow = replace(synthetic_cpu(1.0), gemm_layout_flops_per_s=rates)
    hw = slow.hardware()
    assert hw.layout_ratio("bf16", "tn") == pytest.approx(18.0) and hw.layout_ratio("tf32", "tn") == pytest.approx(0.5)
    assert synthetic_cpu(1.0).hardware().layout_ratio("bf16", "tn") == 1.0
    assert hw.layout_ratio("fp16", "tn") == 1.0  # a dtype not measured
    moved = descriptor.transfer(prior.get_profile("cpu"), descriptor.reference_cpu(), slow, mode="ceilings")
    assert moved.hardware.gemm_layout_ratio == slow.layout_ratios()
    runs = [rates, {"bf16": {"nn": 3e9, "nt": 5e9, "tn": 20e9, "tt": 1e9}, "fp32": rates["fp32"]},
            {"bf16": {"nn": 2e9, "nt": 6e9, "tn": 19e9, "tt": 1e9}, "fp32": rates["fp32"]}]
    assert descriptor.median_layouts(runs)["bf16"] == {"nn": 2e9, "nt": 6e9, "tn": 19e9, "tt": 1e9}
    assert descriptor.median_layouts([{}]) == {}
    with pytest.raises(UserError, match="not this CPU's"):
        descriptor.with_gemm_layouts(synthetic_cpu(1.0))
    monkeypatch.setattr(descriptor, "stored_cpus", lambda folder=None: {})
    assert descriptor.main(["--layouts"]) == 2
    assert "--layouts: no stored descriptor" in capsys.readouterr().err
    assert descriptor.main(["--runs", "3", "--fresh"]) == 2
    assert "only with --measure, --probes or --layouts" in capsys.readouterr().err


def sized_pair():
    """Two SYNTHETIC CPU kinds sharing step probes named as ``descriptor._probe_suite`` names them: on the
    target the fp32 GEMM probes run 2x faster at every size, the bf16 ones slower the larger they are
    (speed-up (FLOPs / 1e6)^-0.5), the element-wise probes 1.5x faster; its bandwidth a quarter of the source's.
    Returns (source, target, the probes' FLOPs by name)."""
    from dataclasses import replace

    names = ["linear 100x50x100", "linear 1000x500x1000", "conv3x3 2x16x16x32", "depthwise3x3 8x96x16",
             "bmm 32x128x32"]
    flops = {n: descriptor.probe_flops(n) for n in names}

    def probes(gemm_fp32, gemm_bf16, other):
        return {"gemm fp32": {n: gemm_fp32(flops[n]) for n in names},
                "gemm bf16": {n: gemm_bf16(flops[n]) for n in names},
                "non-gemm fp32": {"gelu": other}, "non-gemm bf16": {"gelu": other}}

    src = synthetic_cpu(1.0, "synthetic-home-cpu")
    tgt = with_ceilings(src, "synthetic-no-bf16-cpu", memory=0.25)
    src = replace(src, probe_suite=descriptor.PROBE_SUITE,
                  step_probe_s=probes(lambda f: f / 1e9, lambda f: f / 1e9, 1e-3))
    tgt = replace(tgt, probe_suite=descriptor.PROBE_SUITE,
                  step_probe_s=probes(lambda f: f / 2e9, lambda f: f / 1e9 * (f / 1e6) ** 0.5, 1e-3 / 1.5))
    return src, tgt, flops


def test_transfer_by_size_scores_a_rule_by_the_kernels_it_moves():
    """benchmarks/transfer_by_size.py on SYNTHETIC measured kernels whose target times are the source's over the
    sized rule's speed-ups: that rule scores 0 %, one number per group does not; bad input is one line each."""
    module = benchmark_module("transfer_by_size")
    src, tgt, _ = sized_pair()
    speedups = module.rules(src, tgt, [1.0])
    assert list(speedups) == ["group", "gemm-size", "sized 1 MiB"]
    x, x_cat = nodes([1e6, 1e8, 1e3], [1e3, 1e3, 4e6], dtype="bf16")
    x_cat[2, 1] = ops.CATEGORIES.index("elementwise")
    source_s = torch.tensor([1e-3, 1e-1, 2e-3], dtype=torch.float64)
    target_s = source_s / torch.tensor([1.0, 0.1, 0.25], dtype=torch.float64)
    target_s[2] = float("nan")  # unmatched on the target: left out of both sums
    n, mape = module.pair_mape({"k": (x, x_cat, source_s)}, {"k": (x, x_cat, target_s)}, speedups)
    assert n == 1 and mape["sized 1 MiB"] == pytest.approx(0.0, abs=1e-3) and mape["group"] > 50
    with pytest.raises(UserError, match="--cache-mib 0,1: allowed: positive numbers"):
        module.main(["--data", "datasets/cpu", "datasets/cpu", "--cache-mib", "0,1"])
    with pytest.raises(UserError, match="two folders or more"):
        module.main(["--data", "datasets/cpu"])
    with pytest.raises(UserError, match="not a CPU kind"):
        module.main(["--data", "datasets/cpu", "datasets/h200-blind"])
    with pytest.raises(UserError, match="no two of these kinds measured the same step probes"):
        module.main(["--data", "datasets/cpu", "datasets/cpu-amd-epyc-family-26-model-2"])


def test_a_sized_transfer_moves_each_kernel_by_the_probes_at_its_size():
    """``sized_pair``'s two SYNTHETIC CPU kinds (the target's bf16 GEMMs slower the larger they are, as on a
    kind without a fast bf16 path). Moved by kernel
    size, a bf16 GEMM takes the speed-up at its FLOPs (held at the probes' range beyond it), fused attention
    the fp32 GEMMs', a non-GEMM kernel the element-wise probes' under 1 MiB moved and the bandwidths' above.
    Without shared probes "sized" is "split"; a sized prior does not move on; a bad probe name is one line."""
    from dataclasses import replace

    src, tgt, flops = sized_pair()
    assert flops["linear 100x50x100"] == 1e6 and flops["bmm 32x128x32"] == 2.0 * 32 * 128 * 128 * 32
    move = descriptor.sized_move(src, tgt)
    assert move.gemm["fp32"][:2] == pytest.approx((0.0, math.log(2.0)), abs=1e-9)
    assert move.gemm["bf16"][0] == pytest.approx(-0.5) and move.gemm["tf32"] == move.gemm["fp32"]
    assert move.attention == pytest.approx(2.0) and move.in_cache == pytest.approx(1.5)
    assert move.bandwidth == pytest.approx(0.25)

    profile = prior.Profile(src.hardware(), gemm={d: prior.Curve(1.0, 1e9, 1.0) for d in ("fp32", "bf16")},
                            launch_floor_s=1e-12)
    sized = descriptor.transfer(profile, src, tgt, mode="sized")
    assert sized.sized_from is not None and sized.moved_from is None
    lo, hi = min(flops.values()), max(flops.values())
    cases = [  # (flops, bytes moved, dtype, category, expected speed-up)
        ([1e6, 1e8], [1e3, 1e3], "bf16", "matmul", [1.0, 0.1]),
        ([lo / 100, hi * 100], [1e3, 1e3], "bf16", "conv", [(lo / 1e6) ** -0.5, (hi / 1e6) ** -0.5]),
        ([1e7, 1e9], [1e3, 1e3], "fp32", "matmul", [2.0, 2.0]),
        ([1e7, 1e9], [1e3, 1e3], "bf16", "attention", [2.0, 2.0]),
        ([1e3, 1e3], [1e5, 2 ** 21], "fp32", "elementwise", [1.5, 0.25]),
    ]
    for f, moved, dtype, category, speedup in cases:
        x, x_cat = nodes(f, moved, dtype=dtype, category=category)
        before = prior.node_seconds(x, x_cat, profile)
        after = prior.node_seconds(x, x_cat, sized)
        assert (before / after).tolist() == pytest.approx(speedup, rel=1e-4), (dtype, category)

    # without probes on both kinds "sized" moves as "split"
    bare = replace(tgt, probe_suite="", step_probe_s={})
    x, x_cat = nodes([1e7, 1e13], [1e3, 1e3], dtype="bf16")
    as_split = descriptor.transfer(profile, src, bare, mode="split")
    by_size = descriptor.transfer(profile, src, bare, mode="sized")
    assert by_size.sized_from is None and by_size.moved_from is not None
    torch.testing.assert_close(prior.node_seconds(x, x_cat, by_size), prior.node_seconds(x, x_cat, as_split))
    with pytest.raises(UserError, match="cannot move on"):
        descriptor.transfer(sized, tgt, src, mode="sized")
    with pytest.raises(UserError, match="cannot move on"):
        descriptor.transfer(sized, tgt, bare, mode="split")
    with pytest.raises(UserError, match="step probe 'gelu 2048x512': not a GEMM probe"):
        descriptor.probe_flops("gelu 2048x512")
