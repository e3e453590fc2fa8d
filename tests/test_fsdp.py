"""The FSDP schedule and memory model (gnn_ptp/fsdp.py): closed forms on made-up fabrics and times."""

from __future__ import annotations

import pytest
import torch

from gnn_ptp import fsdp
from gnn_ptp.comm import Fabric

# a one-line made-up fabric: alpha 20 us at 8 ranks, 100 GB/s bus bandwidth
FABRIC = Fabric("test", "made up", alpha_us=20.0, busbw_GBps=100.0, measured_gpus=8)


def test_collectives_are_halves_of_a_ring_allreduce():
    size = 256 * 2**20
    ag = fsdp.collective_us(FABRIC, "all_gather", size, 8)
    rs = fsdp.collective_us(FABRIC, "reduce_scatter", size, 8)
    assert ag == rs == pytest.approx(10.0 + 7 / 8 * size / 100e3)
    assert ag + rs == pytest.approx(FABRIC.allreduce_us(size, 8))
    assert fsdp.collective_us(FABRIC, "all_gather", size, 1) == 0.0
    with pytest.raises(ValueError):
        fsdp.collective_us(FABRIC, "broadcast", size, 8)


def test_comm_hidden_behind_long_compute_and_exposed_behind_short():
    blocks = fsdp.Blocks([10_000_000] * 8, 0, "layers")
    slow = fsdp.fsdp_step(800.0, 1600.0, 40.0, blocks, FABRIC, 8, param_bytes=4)
    # per block 40 MB -> 0.35 ms all-gather: hidden but for the first block's gather
    first_ag = fsdp.collective_us(FABRIC, "all_gather", 40e6, 8) / 1e3
    assert slow.compute_ms == pytest.approx(800 + 1600 + 5.0)
    assert slow.exposed_ms == pytest.approx(first_ag * 2 + fsdp.collective_us(FABRIC, "reduce_scatter", 40e6, 8) / 1e3,
                                            rel=1e-6)
    assert slow.allgather_ms == pytest.approx(16 * first_ag)  # gathered twice under fsdp
    fast = fsdp.fsdp_step(1.0, 2.0, 0.1, blocks, FABRIC, 8, param_bytes=4)
    # compute shorter than communication: the step is the communication, one collective after another
    assert fast.iteration_ms == pytest.approx(fast.comm_total_ms + 0.1 / 8 + 2.0 / 8, rel=0.05)
    assert fast.exposed_ms > 0.9 * fast.comm_total_ms - 3.0


def test_no_reshard_gathers_once_and_bf16_halves_the_bytes():
    blocks = fsdp.Blocks([50_000_000] * 4, 10_000_000, "layers")
    full = fsdp.fsdp_step(10.0, 20.0, 1.0, blocks, FABRIC, 8, param_bytes=4)
    once = fsdp.fsdp_step(10.0, 20.0, 1.0, blocks, FABRIC, 8, param_bytes=4, mode="fsdp-no-reshard")
    half = fsdp.fsdp_step(10.0, 20.0, 1.0, blocks, FABRIC, 8, param_bytes=2)
    assert once.allgather_ms == pytest.approx(full.allgather_ms / 2)
    assert once.iteration_ms < full.iteration_ms
    assert half.comm_total_ms < 0.55 * full.comm_total_ms and half.iteration_ms < full.iteration_ms


def test_blocks_are_the_largest_stack_of_alike_layers():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 16),
                                torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(3)]),
                                torch.nn.ModuleList([torch.nn.Linear(16, 4), torch.nn.ReLU()]))
    b = fsdp.find_blocks(model)
    assert b.stack == "1" and b.block_params == [272] * 3 and b.root_params == 1600 + 68
    assert fsdp.find_blocks(torch.nn.Linear(4, 4)).block_params == []


def test_memory_per_rank_shards_the_floor():
    blocks = fsdp.Blocks([100] * 10, 0, "layers")
    one = fsdp.memory_per_rank(16_000, 500, blocks, 1, 4)
    eight = fsdp.memory_per_rank(16_000, 500, blocks, 8, 4)
    assert eight == pytest.approx(16_000 / 8 + 500 + 3 * 100 * 4)
    assert eight < one
    assert fsdp.memory_per_rank(16_000, 500, blocks, 8, 4, "fsdp-no-reshard") > eight


def test_collector_measures_real_fsdp2_steps_on_gloo(tmp_path):
    """Two real processes under torchrun, FSDP2 fully_shard per GPT-2 block, gloo on this CPU."""
    import os
    import signal
    import subprocess
    import sys

    from gnn_ptp import records

    grid = tmp_path / "g.toml"
    grid.write_text('name = "f"\nprecisions = ["fp32"]\n[[model]]\nspec = "hf:gpt2"\n'
                    'set = { n_layer = 2, n_embd = 32, n_head = 2, vocab_size = 100 }\nbatch_size = [2]\nseq_len = [8]\n')
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "gnn_ptp",
         "collect", "--ddp", "--parallel", "fsdp", "--grid", str(grid), "--out", str(tmp_path / "cpu"),
         "--device", "cpu", "--threads", "1", "--warmup-steps", "1", "--min-steps", "2", "--min-time-s", "0.01",
         "--max-time-s", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("torchrun did not finish in 300 s")
    assert proc.returncode == 0, stderr[-3000:]
    (r,) = list(records.iter_records(tmp_path / "cpu" / "f-fsdp.jsonl"))
    assert r["status"] == "ok", r.get("error")
    assert r["ddp"]["parallel"] == "fsdp" and r["ddp"]["world_size"] == 2 and r["fsdp"]["blocks"] == 2
    mem = r["memory"]  # the profiled per-rank peak, with the RSS growth kept beside it
    assert mem["kind"] == "cpu_profiler_peak_allocated" and mem["peak_bytes"] > mem["resident_bytes"] > 0
    assert "rss_peak_growth_bytes" in mem
    assert r["key"] == records.config_key(r["config"], "cpu", r["ddp"])
    assert r["key"] != records.config_key(r["config"], "cpu", {**r["ddp"], "parallel": "ddp"})


def test_parallel_needs_ddp():
    from gnn_ptp.collect import CollectConfig
    from gnn_ptp.errors import UserError

    with pytest.raises(UserError, match="torchrun"):
        CollectConfig("g", "o", parallel="fsdp")
    with pytest.raises(UserError, match="ddp, fsdp or fsdp-no-reshard"):
        CollectConfig("g", "o", ddp=True, parallel="zero3")


def test_without_overlap_every_collective_and_copy_adds():
    blocks = fsdp.Blocks([1000] * 4, 0, "layers")
    s = fsdp.fsdp_step(10.0, 20.0, 4.0, blocks, FABRIC, 4, param_bytes=4, overlap=False, copy_ms=lambda b: 0.5)
    assert s.exposed_ms == pytest.approx(s.allgather_ms + s.reduce_scatter_ms + 4 * 3 * 0.5)
    assert s.iteration_ms == pytest.approx(10.0 + 20.0 + 1.0 + s.exposed_ms)


def test_overheads_add_per_unit_and_per_tensor():
    """Synthetic overheads (made-up numbers): each unit pays its forward and backward cost once, each
    parameter tensor its optimizer cost, with and without overlap."""
    blocks = fsdp.Blocks([1000] * 4, 0, "layers", tensors=10)
    ov = fsdp.Overheads(unit_forward_ms=1.0, unit_backward_ms=2.0, optimizer_tensor_ms=0.1)
    for overlap in (False, True):
        base = fsdp.fsdp_step(10.0, 20.0, 4.0, blocks, FABRIC, 4, param_bytes=4, overlap=overlap)
        more = fsdp.fsdp_step(10.0, 20.0, 4.0, blocks, FABRIC, 4, param_bytes=4, overlap=overlap, overheads=ov)
        assert more.iteration_ms - base.iteration_ms == pytest.approx(4 * (1.0 + 2.0) + 10 * 0.1, rel=1e-6)
        assert more.compute_ms == base.compute_ms


def test_fresh_buffers_above_the_threshold_cost_per_mib():
    """Made-up fresh-buffer figures: a unit above the threshold pays for its gather output in the forward,
    and in the backward for the gather again (fsdp only), the reduce-scatter's input and (if large) output;
    below the threshold nothing."""
    ov = fsdp.Overheads(fresh_threshold_bytes=32 * 2 ** 20, fresh_ms_per_MiB=0.5)
    assert ov.fresh_ms(32 * 2 ** 20) == 0.0 and ov.fresh_ms(40 * 2 ** 20) == pytest.approx(20.0)
    assert fsdp.Overheads().fresh_ms(1 << 30) == 0.0  # not measured: free
    unit = 10 * 2 ** 20  # parameters: 40 MiB in fp32, 20 MiB in bf16
    blocks = fsdp.Blocks([unit], 0, "layers", tensors=2)
    for overlap in (False, True):
        base = fsdp.fsdp_step(10.0, 20.0, 4.0, blocks, FABRIC, 2, param_bytes=4, overlap=overlap)
        more = fsdp.fsdp_step(10.0, 20.0, 4.0, blocks, FABRIC, 2, param_bytes=4, overlap=overlap, overheads=ov)
        assert more.iteration_ms - base.iteration_ms == pytest.approx(3 * 20.0)  # fwd AG, bwd AG, RS input
        base = fsdp.fsdp_step(10.0, 20.0, 4.0, blocks, FABRIC, 2, param_bytes=4, overlap=overlap,
                              mode="fsdp-no-reshard")
        more = fsdp.fsdp_step(10.0, 20.0, 4.0, blocks, FABRIC, 2, param_bytes=4, overlap=overlap, overheads=ov,
                              mode="fsdp-no-reshard")
        assert more.iteration_ms - base.iteration_ms == pytest.approx(2 * 20.0)
        small = fsdp.fsdp_step(10.0, 20.0, 4.0, blocks, FABRIC, 2, param_bytes=2, reduce_bytes=2, overlap=overlap,
                               overheads=ov)
        assert small.iteration_ms == pytest.approx(fsdp.fsdp_step(
            10.0, 20.0, 4.0, blocks, FABRIC, 2, param_bytes=2, reduce_bytes=2, overlap=overlap).iteration_ms)


def test_fresh_threshold_is_bisected(monkeypatch):
    """measure_fresh on a made-up allocator (no process group: the timing is replaced): buffers above
    33 MiB cost 0.4 ms per MiB, smaller ones nothing; the threshold is found to within 1 MiB and the rate
    fitted above it."""
    from gnn_ptp import fsdp_overheads

    cut = 33 * 2 ** 20
    monkeypatch.setattr(fsdp_overheads, "_fresh_extra_ms",
                        lambda nbytes, agree, reps=9: 0.4 * nbytes / 2 ** 20 if nbytes > cut else 0.01)
    got = fsdp_overheads.measure_fresh()
    assert cut - 2 ** 20 <= got["threshold_bytes"] <= cut
    assert got["ms_per_MiB"] == pytest.approx(0.4)
    monkeypatch.setattr(fsdp_overheads, "_fresh_extra_ms", lambda nbytes, agree, reps=9: 0.02)
    assert fsdp_overheads.measure_fresh()["threshold_bytes"] is None  # nothing costly: no threshold


def test_measured_collectives_replace_the_allreduce_split():
    """A profile with made-up all-gather rows answers from them (interpolated in log-log inside the
    measured sizes, the fitted line outside) and says they are measured; without, the ring split."""
    import dataclasses

    from gnn_ptp import interconnect

    base = interconnect.load("h100-nvswitch")
    derived, measured = base.collective_us("all_gather", 1 << 20, 8)
    assert not measured and derived == pytest.approx(fsdp.collective_us(base.level(8), "all_gather", 1 << 20, 8))
    rows = tuple({"gpus": 8, "message_bytes": b, "time_us": t, "collective": "all_gather", "level": "intra"}
                 for b, t in ((1 << 20, 100.0), (4 << 20, 400.0)))
    line = Fabric("ag", "made up", alpha_us=0.0, busbw_GBps=1.0, measured_gpus=8)
    prof = dataclasses.replace(base, measurements=base.measurements + rows,
                               collectives={"all_gather": {"intra": (line,)}})
    t, measured = prof.collective_us("all_gather", 2 << 20, 8)
    assert measured and t == pytest.approx(200.0)  # halfway in log size between 100 and 400 us
    t, _ = prof.collective_us("all_gather", 8 << 20, 8)  # beyond the rows: on from the last row, the line's slope
    assert t == pytest.approx(400.0 + line.allreduce_us(8 << 20, 8) - line.allreduce_us(4 << 20, 8))
    t, _ = prof.collective_us("all_gather", 512 << 10, 8)  # below them: the line
    assert t == pytest.approx(line.allreduce_us(512 << 10, 8))
    # the profile round-trips through its file format with the collectives
    again = interconnect.Interconnect.from_dict(prof.to_dict())
    assert again.collective_us("all_gather", 8 << 20, 8) == prof.collective_us("all_gather", 8 << 20, 8)
    with pytest.raises(ValueError, match="all_gather or reduce_scatter|one of"):
        prof.collective_us("broadcast", 1, 8)


def test_shipped_gloo_profile_has_measured_fsdp_parts():
    from gnn_ptp import interconnect

    prof = interconnect.load("cpu-gloo")
    for world in (2, 4):
        for kind in ("all_gather", "reduce_scatter"):
            t, measured = prof.collective_us(kind, 1 << 20, world)
            assert measured and t > 0
        ov = prof.fsdp_overheads(world)
        assert ov is not None and ov.unit_forward_ms > 0 and ov.unit_backward_ms > 0
    assert interconnect.load("h100-nvswitch").fsdp_overheads(8) is None
    for world in (2, 4):  # beyond the measured sizes the time keeps growing with the size
        for kind in ("all_gather", "reduce_scatter"):
            times = [prof.collective_us(kind, mib << 20, world)[0] for mib in (32, 64, 128, 256)]
            assert times == sorted(times), (kind, world, times)


def test_calibrate_collectives_and_fsdp_overheads(tmp_path):
    """calibrate-comm on this CPU: 2 real gloo processes measure all-gather and reduce-scatter (small
    sizes, short) and FSDP2's overheads on the synthetic stacks, merged into a copy of the profile
    without touching its all-reduce lines."""
    import json
    import shutil

    from gnn_ptp import interconnect
    from gnn_ptp.calibrate import CalibrateConfig, calibrate

    out = tmp_path / "p.json"
    shutil.copy(interconnect.resources.files("gnn_ptp") / "interconnects" / "cpu-gloo.json", out)
    before = json.loads(out.read_text())
    cfg = CalibrateConfig(out=out, procs=(2,), collectives=("all_gather", "reduce_scatter"), min_bytes=64 << 10,
                          max_bytes=4 << 20, fit_min_bytes=512 << 10, min_time_s=0.01, fsdp=True)
    cfg.validate()
    prof = calibrate(cfg)
    assert json.loads(json.dumps([f.to_dict() for f in prof.intra])) == before["intra"]  # all-reduce lines kept
    assert prof.node_sharing == before["node_sharing"]
    assert {f.measured_gpus for f in prof.collectives["reduce_scatter"]["intra"]} == {2, 4}
    assert len(prof.fsdp["2"]["raw"]) == 3 and prof.fsdp["2"]["unit_backward_ms"] >= 0
    fresh = prof.fsdp["2"]["fresh"]  # the fresh-buffer cost, measured by both ranks at once
    assert len(fresh["rows"]) >= len(fsdp_overheads_sizes()) and fresh["ms_per_MiB"] >= 0
    assert interconnect.load(str(out)).fsdp_overheads(2) is not None


def fsdp_overheads_sizes():
    from gnn_ptp.fsdp_overheads import FRESH_SIZES_MIB

    return FRESH_SIZES_MIB


def test_calibrate_collectives_refuses_unknown(tmp_path):
    from gnn_ptp.calibrate import CalibrateConfig
    from gnn_ptp.errors import UserError

    with pytest.raises(UserError, match="--collectives broadcast: allowed all_reduce, all_gather, reduce_scatter"):
        CalibrateConfig(out=tmp_path / "p.json", collectives=("broadcast",)).validate()


def test_predict_parallel_fsdp_and_auto():
    """predict --parallel on the analytic H100 path: FSDP shards the memory, auto picks a mode that fits
    and says why; ddp stays the default."""
    from gnn_ptp.prediction import predict_many

    kw = dict(batch_size=2, seq_len=64, overrides=["n_layer=4", "n_embd=64", "n_head=2", "vocab_size=1000"],
              hardware="h100")
    (ddp,) = predict_many("hf:gpt2", ["amp-bf16"], gpus=8, **kw)
    (full,) = predict_many("hf:gpt2", ["amp-bf16"], gpus=8, parallel="fsdp", **kw)
    (zero2,) = predict_many("hf:gpt2", ["amp-bf16"], gpus=8, parallel="fsdp-no-reshard", **kw)
    (auto,) = predict_many("hf:gpt2", ["amp-bf16"], gpus=8, parallel="auto", **kw)
    assert ddp.parallel == "ddp" and full.parallel == "fsdp" and zero2.parallel == "fsdp-no-reshard"
    assert full.memory_per_gpu_bytes < zero2.memory_per_gpu_bytes < ddp.memory_per_gpu_bytes
    assert full.comm_total_ms > zero2.comm_total_ms > 0  # fsdp gathers twice
    assert auto.parallel in ("ddp", "fsdp", "fsdp-no-reshard") and len(auto.parallel_options) == 3
    best = min(auto.parallel_options, key=lambda o: o["iteration_ms"])
    assert auto.parallel == best["parallel"] and auto.iteration_ms == pytest.approx(best["iteration_ms"])
    assert any(w.startswith("--parallel auto, amp-bf16:") for w in auto.warnings)


@pytest.mark.parametrize("args, message", [
    (dict(gpus=1, parallel="fsdp"), "--parallel fsdp shards over ranks: give --gpus 2 or more"),
    (dict(gpus=8, parallel="zero3"), "--parallel 'zero3': one of ddp, fsdp, fsdp-no-reshard, auto"),
    (dict(gpus=8, parallel="fsdp", grad_compression="bf16"), "--grad-compression is a DDP communication hook"),
])
def test_predict_parallel_bad_input(args, message):
    from gnn_ptp.errors import UserError
    from gnn_ptp.prediction import predict_many

    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        predict_many("hf:gpt2", ["amp-bf16"], batch_size=2, seq_len=64, hardware="h100", **args)


def test_data_parallel_twins_are_the_same_day_records_or_all_where_none_is():
    """records.same_day_twins, the one-process twins of benchmarks/fsdp_gloo.py and ddp_gloo.py: the
    single-process records of the UTC days the multi-process records ran (SYNTHETIC records, timestamps only),
    all of them where none ran that day (a fallback, flagged), all of them with --twins all."""
    from gnn_ptp.records import same_day_twins

    alone = [{"timestamp": t} for t in ("2026-11-24T01:10:00Z", "2026-11-24T23:59:00Z", "2026-11-25T06:00:00Z")]
    fsdp = [{"timestamp": "2026-11-24T02:00:00Z"}, {"timestamp": "2026-11-24T03:00:00Z"}]
    assert same_day_twins(alone, fsdp) == (alone[:2], False)
    assert same_day_twins(alone, fsdp, "all") == (alone, False)
    assert same_day_twins(alone, [{"timestamp": "2026-11-27T10:00:00Z"}]) == (alone, True)
    assert same_day_twins([], fsdp) == ([], False)
