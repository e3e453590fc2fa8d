"""The all-reduce head (gnn_ptp/comm.py): closed forms for the alpha-beta model and DDP's bucketed overlap,
the fit against held-out NCCL measurements, and its wiring into predict (tiny checkpoints, synthetic
graphs: no tracing)."""

from __future__ import annotations

import math
import tomllib
from importlib import resources
from pathlib import Path

import pytest
import torch

from gnn_ptp import comm
from gnn_ptp.comm import BUCKET_CAP_BYTES, FIRST_BUCKET_BYTES, Fabric
from gnn_ptp.errors import UserError

MiB = 1024 * 1024
TOY = Fabric("toy", "alpha 10 us, busbw 100 GB/s, measured at 8", alpha_us=10.0, busbw_GBps=100.0, measured_gpus=8)


def ring_us(fabric: Fabric, nbytes: float, p: int) -> float:
    return fabric.alpha_us * math.log2(p) / math.log2(fabric.measured_gpus) + 2 * (p - 1) / p * nbytes / (
        fabric.busbw_GBps * 1e9) * 1e6


# --- the alpha-beta model ---------------------------------------------------------------------------


@pytest.mark.parametrize("p", [2, 4, 8, 16, 64])
def test_ring_formula(p):
    assert TOY.allreduce_us(64 * MiB, p) == pytest.approx(ring_us(TOY, 64 * MiB, p), rel=1e-12)
    # at the measured world size alpha is the fitted one: 10 us + 2*7/8 * 64 MiB / 100 GB/s
    assert TOY.allreduce_us(64 * MiB, 8) == pytest.approx(10 + 1.75 * 64 * MiB / 1e5)
    # nccl-tests' busbw = algbw * 2(p-1)/p tends to the fabric's busbw for large messages
    big = 1 << 40
    assert big / (TOY.allreduce_us(big, p) * 1e-6) * 2 * (p - 1) / p / 1e9 == pytest.approx(100.0, rel=1e-3)


def test_one_rank_or_no_bytes_costs_nothing():
    assert TOY.allreduce_us(1 << 30, 1) == 0.0
    assert TOY.allreduce_us(0, 8) == 0.0
    with pytest.raises(ValueError, match="gpus"):
        TOY.allreduce_us(1, 0)
    with pytest.raises(ValueError, match="busbw_GBps"):
        Fabric("bad", "", alpha_us=1.0, busbw_GBps=0.0, measured_gpus=8)
    with pytest.raises(ValueError, match="small_busbw_GBps"):
        Fabric("bad", "", alpha_us=1.0, busbw_GBps=1.0, measured_gpus=8, split_bytes=MiB, small_alpha_us=1.0)


def test_fitted_fabrics_reproduce_held_out_measurements():
    """Measured (deterministic, the CSV is fixed): held-out median 2.9 % NVLink, 1.1 % InfiniBand (the
    issue's target: <= 10 %); max 5.0 % and 18.8 %."""
    print("\n" + comm.fit_table())
    nvlink, ib = comm.fabrics()["nvlink"], comm.fabrics()["infiniband"]
    for fabric in (nvlink, ib):
        r = fabric.fit
        assert r.held_out_rows >= 4 and r.fit_rows >= 8
        assert r.held_out_median_rel_err <= 0.10, fabric.name
        assert r.held_out_max_rel_err <= 0.20, fabric.name
        assert r.held_out_mean_rel_err <= 0.06, fabric.name
        assert r.max_rel_err_above_1MiB <= 0.22, fabric.name  # NCCL's protocol switches around 1-16 MiB
        assert r.max_rel_err_below_1MiB > 0.5  # where the lines are not meant to hold
    # the held-out rows, recomputed here from the CSV rather than taken from the report
    held = nvlink.fit.held_out_sizes_bytes
    rows = [r for r in comm.load_measurements() if r["gpus"] == 8 and r["message_bytes"] in held]
    errs = [abs(nvlink.allreduce_us(r["message_bytes"], 8) / r["time_us"] - 1) for r in rows]
    print(f"nvlink held-out rows: {len(rows)}, max error {max(errs):.1%}")
    assert len(rows) == nvlink.fit.held_out_rows and max(errs) <= 0.06
    # large messages: near the maintainers' quoted NVLS busbw (~480) on 8x H100; IB below NVLink; the
    # small-message line has less bandwidth and less latency
    assert 370 <= nvlink.busbw_GBps <= 480
    assert nvlink.small_busbw_GBps < nvlink.busbw_GBps and nvlink.small_alpha_us < nvlink.alpha_us
    assert 200 <= ib.busbw_GBps < nvlink.busbw_GBps and ib.alpha_us > nvlink.alpha_us


@pytest.mark.parametrize("name", ["nvlink", "infiniband"])
@pytest.mark.parametrize("p", [2, 8, 32])
def test_fitted_fabrics_are_monotone_and_continuous_across_their_two_lines(name, p):
    """A message takes the faster line, so time grows with size through the split (no jump down at 16 MiB)
    and the two lines meet where the answer changes from one to the other."""
    fabric = comm.fabrics()[name]
    sizes = [MiB * 2 ** (k / 16) for k in range(-64, 16 * 12)]
    times = [fabric.allreduce_us(s, p) for s in sizes]
    assert all(b > a for a, b in zip(times, times[1:]))
    names = [fabric.line_name(s, p) for s in sizes]
    assert names[0] == "small-message line" and names[-1] == "bandwidth line"
    switch = names.index("bandwidth line")
    assert set(names[switch:]) == {"bandwidth line"}
    assert times[switch] / times[switch - 1] < 2 ** (1 / 16)  # no step larger than the size step itself


def test_outliers_and_fit_rows():
    rows = comm.load_measurements()
    assert {r["gpus"] for r in rows} == {8, 32}
    assert not any(r["gpus"] == 8 and r["message_bytes"] == 32 and r["time_us"] > 60 for r in rows)  # OUTLIER
    held = comm.fabrics()["nvlink"].fit.held_out_sizes_bytes
    assert held[:3] == (4 * MiB, 32 * MiB, 256 * MiB)


def test_fabric_choice():
    assert comm.fabric_for("h100", 8).name == "nvlink"
    assert comm.fabric_for("h100", 2).name == "nvlink"
    assert comm.fabric_for("h100", 16).name == "infiniband"
    assert comm.fabric_for("h200", 32) is comm.fabric_for("h100", 32)
    assert comm.fabric_for("cpu", 8) is None


def test_csv_ships_as_package_data():
    assert resources.files("gnn_ptp").joinpath(comm.MEASUREMENTS).is_file()
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "*.csv" in pyproject["tool"]["setuptools"]["package-data"]["gnn_ptp"]


# --- DDP buckets and overlap ------------------------------------------------------------------------


def test_single_bucket_ready_at_zero_is_fully_exposed():
    ddp = comm.ddp_allreduce([100 * MiB], [0.0], TOY, 8)
    assert ddp.buckets == 1
    assert ddp.exposed_ms == pytest.approx(ring_us(TOY, 100 * MiB, 8) / 1e3)
    assert ddp.total_ms == pytest.approx(ddp.exposed_ms)


def test_bucket_sizes():
    # 1000 gradients of 1/4 MiB: a 1 MiB first bucket, then 25 MiB buckets, the rest in the last
    buckets = comm.make_buckets([MiB / 4] * 1000, [float(i) for i in range(1000)])
    sizes = [b for b, _ in buckets]
    assert sizes[0] == FIRST_BUCKET_BYTES
    assert sizes[1:-1] == [BUCKET_CAP_BYTES] * 9
    assert sizes[-1] == pytest.approx(250 * MiB - MiB - 9 * 25 * MiB)
    assert [r for _, r in buckets][:2] == [3.0, 103.0]  # ready when the gradient that fills it is ready
    # one gradient larger than the cap closes the open bucket with it in (as DDP does)
    assert [b for b, _ in comm.make_buckets([0.5 * MiB, 0.75 * MiB, 10 * MiB, 100 * MiB, MiB], range(5))] == [
        1.25 * MiB, 110 * MiB, MiB]
    assert comm.make_buckets([0.0, 0.0], [1.0, 2.0]) == []


def test_long_backward_hides_all_but_the_last_bucket():
    n = 400  # 1 MiB of gradients every 1 ms: each 25 MiB all-reduce (~0.5 ms) is done long before the next
    ddp = comm.ddp_allreduce([MiB] * n, [1.0] * n, TOY, 8)
    last = ddp.bucket_bytes[-1]
    assert ddp.backward_ms == pytest.approx(n)
    assert ddp.bucket_bytes[:2] == [MiB, 25 * MiB]
    assert ddp.exposed_ms == pytest.approx(ring_us(TOY, last, 8) / 1e3)
    assert ddp.total_ms == pytest.approx(sum(ring_us(TOY, b, 8) for b in ddp.bucket_bytes) / 1e3)


def test_short_backward_serialises_all_reduces():
    # everything ready almost at once: the step waits for every all-reduce, one after another
    ddp = comm.ddp_allreduce([10 * MiB] * 20, [1e-6] * 20, TOY, 8)
    assert ddp.exposed_ms == pytest.approx(ddp.total_ms, abs=1e-4)


def _backward(n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g, dtype=torch.float64) * 2 * MiB).tolist(), \
           (torch.rand(n, generator=g, dtype=torch.float64) * 0.05).tolist()


@pytest.mark.parametrize("seed", [0, 1])
def test_exposed_is_monotone_in_world_size(seed):
    grad_bytes, node_ms = _backward(seed=seed)
    for fabric_name, sizes in (("nvlink", range(2, 9)), ("infiniband", (9, 16, 24, 32, 64, 128, 512))):
        fabric = comm.fabrics()[fabric_name]
        exposed = [comm.ddp_allreduce(grad_bytes, node_ms, fabric, p).exposed_ms for p in sizes]
        assert all(a < b for a, b in zip(exposed, exposed[1:])), (fabric_name, exposed)
    assert comm.ddp_allreduce(grad_bytes, node_ms, comm.fabrics()["nvlink"], 1).exposed_ms == 0.0


@pytest.mark.parametrize("seed", [0, 1])
def test_exposed_is_monotone_in_gradient_bytes(seed):
    """More gradient bytes never expose less at a fixed bucket layout (the schedule is a max-plus chain of
    durations that grow with bytes), nor when the all-reduces cannot keep up with the backward."""
    grad_bytes, node_ms = _backward(seed=seed)
    fabric = comm.fabrics()["nvlink"]
    scales = (0.25, 0.5, 1, 2, 4, 8)
    # the same buckets (caps scaled with the bytes), any overlap
    fixed = [comm.ddp_allreduce([b * k for b in grad_bytes], node_ms, fabric, 8, FIRST_BUCKET_BYTES * k,
                                BUCKET_CAP_BYTES * k).exposed_ms for k in scales]
    assert all(a < b for a, b in zip(fixed, fixed[1:])), fixed
    # DDP's own caps, gradients ready faster than the fabric can reduce them
    fast = [comm.ddp_allreduce([b * k for b in grad_bytes], [t / 100 for t in node_ms], fabric, 8).exposed_ms
            for k in scales]
    assert all(a < b for a, b in zip(fast, fast[1:])), fast


def test_last_bucket_remainder_is_what_a_long_backward_exposes():
    """Across bucket layouts exposed comm is not monotone in bytes, as in DDP: with a long backward only the
    last bucket (what is left after the 25 MiB cuts) is exposed, so 27 MiB of gradients (1 + 25 + 1 MiB
    buckets) expose less than 26 MiB (1 + 25)."""
    fabric = comm.fabrics()["nvlink"]
    exposed = {n: comm.ddp_allreduce([MiB] * n, [1.0] * n, fabric, 8) for n in (26, 27)}
    assert exposed[26].bucket_bytes == [MiB, 25 * MiB] and exposed[27].bucket_bytes == [MiB, 25 * MiB, MiB]
    assert exposed[27].exposed_ms < exposed[26].exposed_ms
    assert exposed[27].total_ms > exposed[26].total_ms


def test_step_comm_picks_backward_nodes_and_falls_back_to_uniform():
    phase = [0, 0, 1, 1, 1, 1, 2]
    grad_bytes = [0, 0, 2 * MiB, 0, 30 * MiB, 3 * MiB, 0]
    node_ms = [5.0, 5.0, 1.0, 2.0, 3.0, 4.0, 7.0]
    ddp = comm.ddp_step_comm(phase, grad_bytes, TOY, 8, node_ms=node_ms)
    direct = comm.ddp_allreduce(grad_bytes[2:6], node_ms[2:6], TOY, 8)
    assert ddp.backward_ms == 10.0 and ddp.exposed_ms == direct.exposed_ms and ddp.bucket_ready_ms == [1.0, 6.0, 10.0]
    # pool readout: no per-node times, every backward kernel gets an equal share of the backward
    uniform = comm.ddp_step_comm(phase, grad_bytes, TOY, 8, backward_ms=10.0)
    assert uniform.bucket_ready_ms == [2.5, 7.5, 10.0]
    assert uniform.exposed_ms == comm.ddp_allreduce(grad_bytes[2:6], [2.5] * 4, TOY, 8).exposed_ms
    # gradient bytes outside the backward count as ready at its end
    late = comm.ddp_step_comm(phase, grad_bytes[:-1] + [4 * MiB], TOY, 8, node_ms=node_ms)
    assert late.bucket_bytes[-1] == 7 * MiB and late.bucket_ready_ms[-1] == 10.0
    with pytest.raises(ValueError, match="node_ms"):
        comm.ddp_step_comm(phase, grad_bytes, TOY, 8)


# --- wiring into predict ----------------------------------------------------------------------------


def _checkpoint(tmp_path, hardware: str, readout: str = "node_sum") -> Path:
    from gnn_ptp import checkpoint
    from gnn_ptp.dataset import trace_target
    from gnn_ptp.graph import feature_version
    from gnn_ptp.model import ModelConfig, StepTimeGNN

    torch.manual_seed(0)
    cfg = ModelConfig(hidden=16, depth=1, readout=readout)
    return checkpoint.save(StepTimeGNN(cfg), {"hardware": hardware, "feature_version": feature_version(trace_target(hardware)),
                                              "model": cfg.to_dict()}, tmp_path / f"{hardware}-{readout}")


@pytest.fixture
def synthetic_graphs(monkeypatch):
    """predict's graphs without tracing: one synthetic graph per precision, backward gradients x 20 (MBs)."""
    from synthetic_data import synthetic_graph

    import gnn_ptp.prediction as predict_mod

    def fake(configs, use_disk_cache=True):
        out = []
        for i, _ in enumerate(configs):
            tensors = synthetic_graph(f"{0xabc + 7 * i:x}")
            tensors["grad_bytes"] = tensors["grad_bytes"] * 20
            out.append((tensors, {"summary": {"flops_by_phase": {"forward": 1.0}}, "param_count": 1000,
                                  "shape": {"seq_len": None, "image_size": None}}))
        return out

    monkeypatch.setattr(predict_mod, "_graphs", fake)
    return fake


def test_predict_adds_exposed_allreduce(tmp_path, synthetic_graphs):
    from torch_geometric.data import Batch, Data

    from gnn_ptp import checkpoint
    from gnn_ptp.prediction import predict_many

    ckpt = _checkpoint(tmp_path, "h100")
    preds = predict_many("random:mlp:3", ["fp32", "amp-bf16"], 4, gpus=8, checkpoint=ckpt)
    model, _ = checkpoint.load(ckpt)
    for pred, (tensors, _) in zip(preds, synthetic_graphs([None, None])):
        assert pred.comm_exposed_ms > 0 and pred.fabric == "nvlink" and pred.allreduce_buckets >= 1
        assert pred.iteration_ms == pytest.approx(pred.compute_ms + pred.comm_exposed_ms)
        assert pred.comm_total_ms >= pred.comm_exposed_ms
        assert not any("has not landed" in w or "extrapolated" in w for w in pred.warnings)
        # the right graph's own node times were used (nodes of several graphs share one batch)
        d = Data(**tensors)
        d.num_nodes = tensors["x"].shape[0]
        with torch.no_grad():
            node_ms = model(Batch.from_data_list([d]))["log_node_ms"].double().exp().tolist()
        expect = comm.ddp_step_comm(tensors["phase"].tolist(), tensors["grad_bytes"].tolist(),
                                    comm.fabrics()["nvlink"], 8, node_ms=node_ms)
        assert pred.comm_exposed_ms == pytest.approx(expect.exposed_ms, rel=1e-4)
    assert {"comm_exposed_ms", "comm_total_ms", "allreduce_buckets", "fabric"} <= set(preds[0].to_dict())

    one = predict_many("random:mlp:3", ["fp32"], 4, gpus=1, checkpoint=ckpt)[0]
    assert one.comm_exposed_ms == 0.0 and one.fabric == "" and one.iteration_ms == one.compute_ms
    ib = predict_many("random:mlp:3", ["fp32"], 4, gpus=16, checkpoint=ckpt)[0]
    assert ib.fabric == "infiniband" and ib.comm_exposed_ms > preds[0].comm_exposed_ms
    assert any("extrapolated from 32-rank infiniband" in w for w in ib.warnings)


def test_predict_pool_readout_uses_uniform_backward(tmp_path, synthetic_graphs):
    from gnn_ptp.prediction import predict_many

    pred = predict_many("random:mlp:3", ["fp32"], 4, gpus=8, checkpoint=_checkpoint(tmp_path, "h100", "pool"))[0]
    assert pred.comm_exposed_ms > 0 and pred.fabric == "nvlink"


def test_predict_cpu_checkpoint_uses_the_calibrated_gloo_profile(tmp_path, synthetic_graphs):
    from gnn_ptp import interconnect
    from gnn_ptp.prediction import predict_many

    ckpt = _checkpoint(tmp_path, "cpu")
    one = predict_many("random:mlp:3", ["fp32"], 4, gpus=1, checkpoint=ckpt)[0]
    two = predict_many("random:mlp:3", ["fp32"], 4, gpus=2, checkpoint=ckpt)[0]
    gloo = interconnect.load("cpu-gloo")
    assert two.interconnect == "cpu-gloo" and not gloo.overlap
    # ranks share the cores: the measured slowdown applies, and nothing hides the all-reduce
    assert two.compute_slowdown == pytest.approx(gloo.node_sharing["2"]["compute_slowdown"])
    assert two.compute_ms == pytest.approx(one.compute_ms * two.compute_slowdown)
    assert two.comm_exposed_ms == pytest.approx(two.comm_total_ms) and two.comm_exposed_ms > 0
    assert two.scaling_efficiency == pytest.approx(one.compute_ms / two.iteration_ms)
    with pytest.raises(UserError, match="multi-node profile"):
        predict_many("random:mlp:3", ["fp32"], 4, gpus=8, checkpoint=ckpt)


def test_predict_unknown_hardware_needs_an_interconnect(tmp_path, synthetic_graphs):
    from gnn_ptp.prediction import predict_many

    ckpt = _checkpoint(tmp_path, "a100")
    assert predict_many("random:mlp:3", ["fp32"], 4, gpus=1, checkpoint=ckpt)[0].comm_exposed_ms == 0.0
    with pytest.raises(UserError, match="no interconnect profile for a100"):
        predict_many("random:mlp:3", ["fp32"], 4, gpus=2, checkpoint=ckpt)
    pred = predict_many("random:mlp:3", ["fp32"], 4, gpus=2, checkpoint=ckpt, interconnect="h100-nvswitch")[0]
    assert pred.interconnect == "h100-nvswitch" and pred.comm_exposed_ms >= 0


def test_grad_accum_and_compression(tmp_path, synthetic_graphs):
    from gnn_ptp.prediction import predict_many

    ckpt = _checkpoint(tmp_path, "h100")
    base = predict_many("random:mlp:3", ["fp32"], 4, gpus=8, checkpoint=ckpt, epochs=1, dataset_size=3200)[0]
    acc = predict_many("random:mlp:3", ["fp32"], 4, gpus=8, checkpoint=ckpt, grad_accum=4, epochs=1,
                       dataset_size=3200)[0]
    # k micro-steps of forward + backward, one optimizer step, one all-reduce per optimizer step
    assert acc.compute_ms == pytest.approx(4 * (base.forward_ms + base.backward_ms) + base.optimizer_ms)
    assert acc.comm_total_ms == pytest.approx(base.comm_total_ms)
    assert acc.global_batch_size == 4 * 8 * 4 and base.global_batch_size == 32
    assert base.steps == 100 and acc.steps == 25
    assert acc.scaling_efficiency >= base.scaling_efficiency
    half = predict_many("random:mlp:3", ["fp32"], 4, gpus=8, checkpoint=ckpt, grad_compression="bf16")[0]
    assert half.comm_total_ms < base.comm_total_ms
    small = predict_many("random:mlp:3", ["fp32"], 4, gpus=8, checkpoint=ckpt, bucket_cap_mb=1)[0]
    assert small.allreduce_buckets > base.allreduce_buckets
    with pytest.raises(UserError, match="grad-accum"):
        predict_many("random:mlp:3", ["fp32"], 4, gpus=8, checkpoint=ckpt, grad_accum=0)
