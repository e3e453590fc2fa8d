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
