"""Interconnect profiles (gnn_ptp/interconnect.py), `gnn-ptp comm`, `gnn-ptp calibrate-comm` with real gloo
processes, and DDP's bucket assignment against torch.distributed's own."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from gnn_ptp import comm, interconnect
from gnn_ptp.cli import main
from gnn_ptp.errors import UserError

MiB = 1 << 20


# --- closed forms -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["h100-nvswitch", "h100-ib-ndr400", "cpu-gloo"])
def test_one_rank_costs_nothing_and_time_grows_with_bytes_and_ranks(name):
    profile = interconnect.load(name)
    assert profile.allreduce(64 * MiB, 1).time_us == 0.0
    max_ranks = profile.gpus_per_node * (4 if profile.inter else 1)
    ranks = [p for p in (2, 4, 8, 16, 32) if p <= max_ranks]
    sizes = [MiB * 2 ** k for k in range(0, 11)]
    for p in ranks:
        times = [profile.allreduce(s, p).time_us for s in sizes]
        assert all(a < b for a, b in zip(times, times[1:])), (name, p)
    for s in sizes:
        by_rank = [profile.allreduce(s, p) for p in ranks]
        # within one level time grows with ranks; crossing to the inter-node level it jumps up
        assert all(a.time_us <= b.time_us for a, b in zip(by_rank, by_rank[1:])), (name, s)


def test_two_ranks_closed_form():
    profile = interconnect.load("h100-nvswitch")
    nv = profile.intra[0]
    r = profile.allreduce(100 * MiB, 2)
    # alpha scaled by log2(2)/log2(8); ring traffic 2(p-1)/p * S = S at p = 2
    expect_us = nv.alpha_us / 3 + 100 * MiB / (nv.busbw_GBps * 1e3)
    assert r.time_us == pytest.approx(expect_us)
    assert r.algbw_GBps == pytest.approx(100 * MiB / (expect_us * 1e3))
    assert r.busbw_GBps == pytest.approx(r.algbw_GBps)  # 2(p-1)/p = 1
    assert not r.measured and r.level == "nvlink"


def test_node_rules():
    ib = interconnect.load("h100-ib-ndr400")
    assert ib.nodes_for(8) == 1 and ib.nodes_for(9) == 2 and ib.nodes_for(64) == 8
    assert ib.level(8).name == "nvlink" and ib.level(16).name == "infiniband"
    assert ib.level(8, nodes=2).name == "infiniband"  # 4 GPUs on each of 2 nodes crosses the network
    with pytest.raises(UserError, match="does not split evenly"):
        ib.nodes_for(12, 5)
    with pytest.raises(UserError, match="per node"):
        ib.nodes_for(32, 2)
    with pytest.raises(UserError, match="multi-node profile"):
        interconnect.load("h100-nvswitch").allreduce(MiB, 16)
    assert interconnect.default_for("h100", 8).name == "h100-nvswitch"
    assert interconnect.default_for("h200", 16).name == "h100-ib-ndr400"
    assert interconnect.default_for("h100", 8, nodes=2).name == "h100-ib-ndr400"
    assert interconnect.default_for("cpu", 2).name == "cpu-gloo"
    assert interconnect.default_for("a100", 2) is None


def test_profile_round_trip_and_bad_files(tmp_path):
    for profile in interconnect.builtin().values():
        path = tmp_path / f"{profile.name}.json"
        interconnect.write(profile, path)
        again = interconnect.load(str(path))
        assert again == profile
    (tmp_path / "bad.json").write_text("{\"name\": 1}")
    with pytest.raises(UserError, match="not an interconnect profile"):
        interconnect.load(str(tmp_path / "bad.json"))
    with pytest.raises(UserError, match="no such file"):
        interconnect.load(str(tmp_path / "missing.json"))
    with pytest.raises(UserError, match="shipped profiles are h100-nvswitch"):
        interconnect.load("h100-nvlink")


def test_cpu_profile_is_a_measurement():
    gloo = interconnect.load("cpu-gloo")
    assert gloo.env["backend"] == "gloo" and gloo.env["date"] and gloo.env["torch"]
    assert {r["gpus"] for r in gloo.measurements} == {2, 4}
    for f in gloo.intra:  # the fit reproduces its own held-out rows (>= 1 MiB) within 35 %
        assert f.fit.held_out_rows >= 1 and f.fit.held_out_max_rel_err < 0.35
    assert not gloo.overlap and set(gloo.node_sharing) == {"2", "4"}


def test_overlap_off_exposes_everything():
    toy = comm.Fabric("toy", "", alpha_us=10.0, busbw_GBps=100.0, measured_gpus=8)
    grads, times = [10 * MiB] * 10, [5.0] * 10
    on = comm.ddp_allreduce(grads, times, toy, 8)
    off = comm.ddp_allreduce(grads, times, toy, 8, overlap=False)
    assert off.total_ms == pytest.approx(on.total_ms)
    assert off.exposed_ms == pytest.approx(off.total_ms) and on.exposed_ms < off.exposed_ms


# --- DDP's bucket assignment -------------------------------------------------------------------------


def _models():
    torchvision = pytest.importorskip("torchvision")
    from transformers import GPT2Config, GPT2LMHeadModel

    yield "resnet18", torchvision.models.resnet18()
    yield "gpt2-4", GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=5000))


@pytest.mark.parametrize("cap_mb", [25.0, 4.0])
def test_bucket_assignment_equals_torch_distributed(cap_mb):
    """make_buckets gives the buckets torch.distributed computes for DDP (the C++ assignment DDP's Reducer
    uses), for the parameters of real models in DDP's initial order: reverse registration order."""
    import torch.distributed as dist

    limits = [comm.FIRST_BUCKET_BYTES, int(cap_mb * MiB)]
    for name, model in _models():
        params = [p for p in model.parameters() if p.requires_grad][::-1]
        indices, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
        theirs = [sum(params[i].numel() * params[i].element_size() for i in bucket) for bucket in indices]
        nbytes = [p.numel() * p.element_size() for p in params]
        ours = [b for b, _ in comm.make_buckets(nbytes, list(range(len(nbytes))), limits[0], limits[1])]
        assert ours == theirs, name


# --- the commands -------------------------------------------------------------------------------------


def test_comm_cli_json(capsys):
    assert main(["comm", "--bytes", "1G", "--gpus", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"time_us", "algbw_GBps", "busbw_GBps", "algorithm"} <= set(out)
    assert out["nodes"] == 4 and out["interconnect"] == "h100-ib-ndr400" and out["measured"]
    # nccl-tests' definitions
    assert out["algbw_GBps"] == pytest.approx(out["message_bytes"] / out["time_us"] / 1e3)
    assert out["busbw_GBps"] == pytest.approx(out["algbw_GBps"] * 2 * 31 / 32)
    assert main(["comm", "--bytes", "64M", "--gpus", "8"]) == 0
    assert "h100-nvswitch" in capsys.readouterr().out
    assert main(["comm", "--list"]) == 0
    assert "cpu-gloo" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["comm", "--gpus", "8"], "give --bytes and --gpus"),
    (["comm", "--bytes", "1M", "--gpus", "16", "--interconnect", "h100-nvswitch"], "multi-node"),
    (["comm", "--bytes", "1M", "--gpus", "4", "--interconnect", "nvswitch"], "shipped profiles are"),
    (["calibrate-comm", "--out", "x.json", "--min-bytes", "2M", "--max-bytes", "1M"], "need 4 <= min <= max"),
])
def test_comm_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_comm_rejects_bad_sizes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["comm", "--bytes", "12X", "--gpus", "2"])
    assert e.value.code == 2 and "is not a size" in capsys.readouterr().err


def test_calibrate_comm_with_real_gloo_processes(tmp_path):
    """Two gloo worlds started by the command itself; the profile merges, and predict/comm read it."""
    out = tmp_path / "lab.json"
    small = ["--min-bytes", "128K", "--max-bytes", "8M", "--fit-min-bytes", "512K", "--min-time-s", "0.05"]
    cmd = [sys.executable, "-m", "gnn_ptp", "calibrate-comm", "--out", str(out)] + small
    done = subprocess.run(cmd + ["--procs", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    first = interconnect.load(str(out))
    assert first.name == "lab" and [f.measured_gpus for f in first.intra] == [2]
    assert {r["message_bytes"] for r in first.measurements} == {128 << 10, 256 << 10, 512 << 10, 1 << 20,
                                                                2 << 20, 4 << 20, 8 << 20}
    assert all(r["time_us"] > 0 for r in first.measurements) and "2" in first.node_sharing
    sharing = first.node_sharing["2"]  # the compute slowdown is the median of its rounds, each kept
    assert len(sharing["compute_slowdown_rounds"]) == 5 and all(r > 0 for r in sharing["compute_slowdown_rounds"])
    assert sharing["compute_slowdown"] == statistics.median(sharing["compute_slowdown_rounds"])
    done = subprocess.run(cmd + ["--procs", "3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    merged = interconnect.load(str(out))
    assert [f.measured_gpus for f in merged.intra] == [2, 3]  # the 2-rank fit was kept
    assert merged.intra[0] == first.intra[0]
    r = merged.allreduce(1 << 20, 3)
    assert r.measured and r.time_us > 0 and r.interconnect == "lab"
    assert main(["comm", "--bytes", "1M", "--gpus", "2", "--interconnect", str(out)]) == 0


def test_a_flat_calibration_is_a_clear_error():
    """Times that do not grow with size (latency or noise only) give no bandwidth: say so, do not write
    a negative bandwidth (synthetic rows)."""
    from gnn_ptp.calibrate import CalibrateConfig, _fit

    flat = [{"gpus": 2, "message_bytes": 1 << k, "time_us": 100.0 - k} for k in range(20, 25)]
    with pytest.raises(UserError, match="do not grow with message size"):
        _fit(flat, 2, "intra", CalibrateConfig(out=None, max_bytes=1 << 24), "gloo", None)


def test_calibrate_comm_refuses_to_overwrite_other_files(tmp_path, capsys):
    out = tmp_path / "notes.json"
    out.write_text("[1, 2, 3]")
    from gnn_ptp.calibrate import CalibrateConfig, _merge

    with pytest.raises(UserError, match="not overwriting"):
        _merge(CalibrateConfig(out=out), [], [], [], {"backend": "gloo"}, 2, False, 2)
    assert out.read_text() == "[1, 2, 3]"


def _synthetic_rerun(path, tmp_path, factor: float):
    """A SYNTHETIC second run of a real profile: every measured time and every synthetic stack's FSDP step
    times ``factor`` (made up, named so), written next to the test."""
    d = json.loads(path.read_text())
    for r in d["measurements"]:
        r["time_us"] *= factor
    for w in d["fsdp"].values():
        for s in w["raw"]:
            s["fsdp"] = {k: v * factor for k, v in s["fsdp"].items()}
    out = tmp_path / f"synthetic-rerun-{factor}.json"
    out.write_text(json.dumps(d))
    return out


def test_calibrate_comm_pools_runs_by_the_median_and_refits_from_every_run_s_stacks(tmp_path, capsys):
    """``calibrate-comm --pool A B --out C`` measures nothing: per world size, collective and size the
    median of the runs' times, the lines and FSDP2's overheads fitted again from them; a run pooled with
    itself gives back its own fits. Runs of another measurement, or a single run, are refused in one line."""
    from gnn_ptp.calibrate import CalibrateConfig, pool

    from pathlib import Path

    real = Path(interconnect.__file__).with_name("interconnects") / "cpu-gloo-intel-r-xeon-r-processor-family-6-model-167.json"
    original = interconnect.Interconnect.from_dict(json.loads(real.read_text()))
    same = pool(CalibrateConfig(out=tmp_path / "same.json"), [real, real])
    for a, b in zip(original.intra, same.intra):
        assert (b.alpha_us, b.busbw_GBps) == pytest.approx((a.alpha_us, a.busbw_GBps))
    assert same.fsdp["2"]["unit_forward_ms"] == pytest.approx(original.fsdp["2"]["unit_forward_ms"])
    assert len(same.fsdp["4"]["raw"]) == 2 * len(original.fsdp["4"]["raw"])

    slower = _synthetic_rerun(real, tmp_path, 1.5)
    both = pool(CalibrateConfig(out=tmp_path / "both.json"), [real, slower])
    key = lambda r: (r["gpus"], r["collective"], r["message_bytes"])  # noqa: E731
    mine = {key(r): r["time_us"] for r in original.measurements}
    assert all(r["time_us"] == pytest.approx(1.25 * mine[key(r)]) and r["runs"] == 2 for r in both.measurements)
    assert both.env["pooled_from"][1]["file"] == str(slower)
    assert original.fsdp["4"]["unit_backward_ms"] < both.fsdp["4"]["unit_backward_ms"]

    d = json.loads(real.read_text())
    d["measurements"] = [r for r in d["measurements"] if r["gpus"] == 2]
    other = tmp_path / "two-ranks-only.json"
    other.write_text(json.dumps(d))
    with pytest.raises(UserError, match="not a run of the same measurement"):
        pool(CalibrateConfig(out=tmp_path / "x.json"), [real, other])
    assert main(["calibrate-comm", "--pool", str(real), "--out", str(tmp_path / "y.json")]) == 2
    assert "two or more" in capsys.readouterr().err
    assert main(["calibrate-comm", "--pool", str(real), str(tmp_path / "nope.json"), "--out", str(tmp_path / "z.json")]) == 2
    assert "no such file" in capsys.readouterr().err
