"""The collector on the CPU: records, resuming, --limit, --repeat, the budget, oom/error records, the
folder-name check, grids, the record reader; and a real two-process DDP run under torchrun (gloo)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gnn_ptp import cli, collect as collect_mod, host_probe, records
from gnn_ptp.collect import CollectConfig, collect
from gnn_ptp.errors import UserError
from gnn_ptp.grid import load_grid
from gnn_ptp.spec import build as spec_build

# the classic loop (one model per record); tests/test_harvest.py covers the harvest loop
FAST = dict(warmup_steps=1, min_steps=2, min_time_s=0.01, max_time_s=0.2, threads=1, device="cpu", mode="classic")
FAST_ARGS = ["--warmup-steps", "1", "--min-steps", "2", "--min-time-s", "0.01", "--max-time-s", "0.2",
             "--threads", "1", "--device", "cpu", "--mode", "classic"]

TINY_GRID = """
name = "tiny"
precisions = ["fp32", "bf16", "tf32"]   # tf32 means nothing on a CPU: skipped there
optimizers = ["adamw"]

[[model]]
spec = "random:mlp:3"
set = { in_features = 16, width = 32, depth = 2, num_classes = 4, dropout = 0.0, norm = "none" }
batch_size = [2, 4]
"""

TIMING_KEYS = {"median", "p10", "p90", "n", "mean"}


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def grid(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_GRID)
    return path


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "cpu"  # the folder must be named for the hardware


def run(grid, out, **kw) -> dict:
    return collect(CollectConfig(str(grid), str(out), **{**FAST, **kw}))


def read(out: Path) -> list[dict]:
    return list(records.iter_records(out))


# --- records ----------------------------------------------------------------------------------------


def test_collect_writes_documented_records(grid, out):
    counts = run(grid, out)
    assert counts["grid"] == 4 and counts["ok"] == 4 and counts["skipped_precision"] == 2
    assert counts["oom"] == counts["error"] == 0 and not counts["interrupted"] and not counts["stopped_for_budget"]
    assert [p.name for p in out.iterdir()] == ["tiny.jsonl"]
    rows = read(out)
    assert len(rows) == 4 and len({r["key"] for r in rows}) == 4
    for r in rows:
        assert r["schema"] == records.SCHEMA_VERSION
        assert r["status"] == "ok" and r["error"] is None
        assert r["key"] == records.config_key(r["config"], "cpu")
        assert set(r["config"]) == set(records.CONFIG_FIELDS)
        assert r["config"]["spec"] == "random:mlp:3" and r["config"]["precision"] in ("fp32", "bf16")
        for phase in ("step_ms", "forward_ms", "backward_ms", "optimizer_ms"):
            t = r["timing"][phase]
            assert TIMING_KEYS <= set(t)
            assert t["n"] >= 2 and 0 < t["p10"] <= t["median"] <= t["p90"]
        t = r["timing"]
        parts = t["forward_ms"]["median"] + t["backward_ms"]["median"] + t["optimizer_ms"]["median"]
        assert parts == pytest.approx(t["step_ms"]["median"], rel=0.5)
        assert t["warmup_steps"] == 1 and len(t["warmup_step_ms"]) == 1 and t["clock"] == "perf_counter"
        assert r["memory"]["kind"] == "cpu_rss_high_water_mark" and r["memory"]["peak_bytes"] >= 0
        env = r["env"]
        assert env["hardware"] == "cpu" and env["device_name"] == "cpu" and env["cuda"] is None
        assert env["torch"] == torch.__version__ and env["num_threads"] == 1
        assert r["timestamp"].endswith("+00:00")
        assert r["family"] == "random-mlp" and r["modality"] == "tabular" and r["params"] > 0
        assert r["shape"]["batch_size"] == r["config"]["batch_size"]
        assert r["grid"] == "tiny" and r["repeat"] is False
        assert r["collector"]["wall_s"] > 0
        assert 0 < r["host_probe"]["issue_us_before"] < 1e4 and 0 < r["host_probe"]["issue_us_after"] < 1e4
        probe = r["host_probe"]  # the fresh-mapping cost, taken outside the memory label's window
        assert probe["fresh_ms_per_mib_before"] >= 0 and probe["fresh_ms_per_mib_after"] >= 0
        assert probe["fresh_faults_per_mib"] > 0 and probe["fresh_mib"] == host_probe.FRESH_MIB
        assert r["memory"]["peak_bytes"] < host_probe.FRESH_MIB * 2 ** 20  # a tiny MLP's steps, not the probe's buffers
        assert set(r["optimizer_state"]) == {"exp_avg", "exp_avg_sq"}
        assert r["optimizer_state"]["exp_avg_sq"]["elements"] == r["params"]
    assert {(r["config"]["batch_size"], r["config"]["precision"]) for r in rows} == {
        (2, "fp32"), (2, "bf16"), (4, "fp32"), (4, "bf16")}


def test_rerun_skips_what_is_there(grid, out):
    run(grid, out)
    before = (out / "tiny.jsonl").read_text()
    counts = run(grid, out)
    assert counts["already"] == 4 and counts["ok"] == 0
    assert (out / "tiny.jsonl").read_text() == before


def test_limit(grid, out):
    assert run(grid, out, limit=1)["ok"] == 1
    assert len(read(out)) == 1
    counts = run(grid, out, limit=2)
    assert counts["ok"] == 2 and counts["already"] == 2  # 1 held + 1 beyond the limit
    assert len({r["key"] for r in read(out)}) == 3


def test_repeat_measures_only_what_is_held(grid, out):
    run(grid, out, limit=2)
    held = {r["key"] for r in read(out)}
    counts = run(grid, out, repeat=True)
    assert counts["ok"] == 2
    rows = read(out)
    assert len(rows) == 4
    again = [r for r in rows if r["repeat"]]
    assert {r["key"] for r in again} == held


def test_budget_stops_cleanly(grid, out, monkeypatch):
    real = collect_mod.measure

    def slow_measure(*args, **kwargs):
        result = real(*args, **kwargs)
        result["collector"]["wall_s"] = 1000.0  # as if each configuration took 1000 s
        return result

    monkeypatch.setattr(collect_mod, "measure", slow_measure)
    counts = run(grid, out, budget_s=500.0)
    assert counts["stopped_for_budget"] and counts["ok"] == 1 and not counts["interrupted"]
    assert len(read(out)) == 1
    # the CLI says so and exits 0
    code = cli.main(["collect", "--grid", str(grid), "--out", str(out), "--budget-s", "500", *FAST_ARGS])
    assert code == 0


def _failing_build(exc_for_batch: dict):
    real = spec_build

    def build(spec, shape, device="meta", param_dtype=torch.float32):
        exc = exc_for_batch.get(shape.batch_size)
        if exc is not None and torch.device(device).type != "meta":  # the meta pre-check still passes
            raise exc
        return real(spec, shape, device, param_dtype)

    return build


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
                                 MemoryError(), RuntimeError("DefaultCPUAllocator: can't allocate memory")])
def test_oom_is_recorded_and_collection_goes_on(grid, out, monkeypatch, exc):
    monkeypatch.setattr(collect_mod, "build", _failing_build({4: exc}))
    counts = run(grid, out)
    assert counts["oom"] == 2 and counts["ok"] == 2 and counts["error"] == 0
    rows = read(out)
    assert len(rows) == 4
    for r in rows:
        if r["config"]["batch_size"] == 4:
            assert r["status"] == "oom" and "timing" not in r
            assert r["error"].startswith(type(exc).__name__)
            assert r["env"]["hardware"] == "cpu" and r["key"]
        else:
            assert r["status"] == "ok"
    # an oom is an answer: a rerun does not try again, not even with --retry-errors
    monkeypatch.setattr(collect_mod, "build", _failing_build({}))
    assert run(grid, out, retry_errors=True)["ok"] == 0


def test_error_is_recorded_and_retried_on_request(grid, out, monkeypatch):
    monkeypatch.setattr(collect_mod, "build", _failing_build({2: ValueError("boom\nsecond line")}))
    counts = run(grid, out)
    assert counts["error"] == 2 and counts["ok"] == 2
    errors = [r for r in read(out) if r["status"] == "error"]
    assert len(errors) == 2 and all(r["error"] == "ValueError: boom" for r in errors)
    monkeypatch.setattr(collect_mod, "build", _failing_build({}))
    assert run(grid, out)["ok"] == 0  # errors are skipped by default
    counts = run(grid, out, retry_errors=True)
    assert counts["ok"] == 2 and counts["already"] == 2


def test_interrupt_keeps_what_was_measured(grid, out, monkeypatch):
    real = collect_mod.measure
    calls = []

    def measure(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(collect_mod, "measure", measure)
    code = cli.main(["collect", "--grid", str(grid), "--out", str(out), *FAST_ARGS])
    assert code == 130
    assert len(read(out)) == 1


def test_folder_must_be_named_for_the_hardware(grid, tmp_path):
    with pytest.raises(UserError, match="'cpu'") as e:
        run(grid, tmp_path / "h100")
    assert "--allow-dir-mismatch" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "h100").exists()
    counts = run(grid, tmp_path / "h100", allow_dir_mismatch=True, limit=1)
    assert counts["ok"] == 1


def test_device_cuda_without_gpu_is_user_error(grid, out):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(UserError, match="no CUDA GPU"):
        run(grid, out, device="cuda")


def test_ddp_outside_torchrun_is_user_error(grid, out, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(UserError, match="torchrun"):
        run(grid, out, ddp=True)


def test_collect_config_validation():
    with pytest.raises(UserError, match="--min-steps"):
        CollectConfig("g", "o", min_steps=-1)
    with pytest.raises(UserError, match="--overhead-target"):
        CollectConfig("g", "o", overhead_target=1.5)
    with pytest.raises(UserError, match="--device"):
        CollectConfig("g", "o", device="tpu")


def test_grid_typo_fails_before_measuring(tmp_path, out):
    path = tmp_path / "bad.toml"
    path.write_text('precisions = ["fp32"]\n[[model]]\nspec = "hf:gpt3"\n')
    with pytest.raises(UserError, match="'gpt2'"):
        run(path, out)
    assert not out.exists() or not list(out.glob("*.jsonl"))


# --- the record reader ----------------------------------------------------------------------------


def test_torn_last_line_is_skipped_with_warning(tmp_path):
    path = tmp_path / "cpu" / "x.jsonl"
    records.append_record({"key": "a", "status": "ok"}, path.parent, path.name)
    records.append_record({"key": "b", "status": "ok", "_private": 1}, path.parent, path.name)
    with open(path, "a") as f:
        f.write('{"key": "c", "sta')  # power loss mid-append
    warnings = []
    rows = list(records.iter_records(path.parent, warn=warnings.append))
    assert [r["key"] for r in rows] == ["a", "b"]
    assert "_private" not in path.read_text()  # underscore keys are never written
    assert rows[0]["_file"] == "x.jsonl"
    assert len(warnings) == 1 and "x.jsonl:3" in warnings[0]


def test_torn_line_warning_goes_to_stderr_by_default(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text('{"key": "a"}\n{"key": ')
    assert [r["key"] for r in records.iter_records(path)] == ["a"]
    assert "warning:" in capsys.readouterr().err


def test_blank_lines_and_missing_path(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"key": "a"}\n\n{"key": "b"}\n')
    assert len(list(records.iter_records(path))) == 2
    with pytest.raises(UserError, match="no records"):
        list(records.iter_records(tmp_path / "nope"))
    assert records.load_records(path, status=None)[0]["key"] == "a"


def test_config_key():
    config = {"spec": "hf:gpt2", "set": {"n_layer": 2}, "task": None, "batch_size": 2, "seq_len": 64,
              "image_size": None, "precision": "fp32", "optimizer": "adamw", "ignored": 1}
    key = records.config_key(config, "cpu")
    assert key == records.config_key(dict(reversed(list(config.items()))), "cpu")  # order-free
    assert key != records.config_key(config, "h100")
    assert key != records.config_key({**config, "precision": "bf16"}, "cpu")
    assert key == records.config_key({**config, "ignored": 2}, "cpu")
    ddp = {"world_size": 2, "backend": "gloo", "bucket_cap_mb": 25.0}
    assert key != records.config_key(config, "cpu", ddp)
    assert len(key) == 16


@pytest.mark.parametrize("name, label", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                         ("NVIDIA H100 PCIe", "h100"), ("cpu", "cpu"),
                                         ("NVIDIA A100-SXM4-40GB", "a100"), ("NVIDIA GeForce RTX 4090", "geforcertx4090")])
def test_hardware_label(name, label):
    assert records.hardware_label(name) == label


def test_quantiles():
    q = collect_mod._quantiles([5.0, 1.0, 3.0, 2.0, 4.0])
    assert q["median"] == 3.0 and q["n"] == 5 and q["mean"] == 3.0
    assert q["p10"] == pytest.approx(1.4) and q["p90"] == pytest.approx(4.6)
    assert collect_mod._quantiles([7.0]) == {"median": 7.0, "p10": 7.0, "p90": 7.0, "n": 1, "mean": 7.0}


# --- grids ----------------------------------------------------------------------------------------


def test_grid_expansion_and_interleaving(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text("""
precisions = ["fp32", "amp-bf16"]
[[model]]
spec = "hf:gpt2"
set = { n_layer = 1 }
batch_size = [2, 8]
seq_len = [64, 128]
[[model]]
spec = "torchvision:resnet18"
batch_size = 4
image_size = [32]
precisions = ["bf16"]
[[random]]
kind = "mlp"
seeds = [0, 4]
batch_size = [16, 64]
samples = 2
max_params = 1_000_000
""")
    name, configs = load_grid(path)
    assert name == "g"  # defaults to the file's stem
    gpt2 = [c for c in configs if c["spec"] == "hf:gpt2"]
    assert len(gpt2) == 2 * 2 * 2 and {c["precision"] for c in gpt2} == {"fp32", "amp-bf16"}
    assert gpt2[0]["set"] == {"n_layer": 1} and gpt2[0]["image_size"] is None
    resnet = [c for c in configs if c["spec"] == "torchvision:resnet18"]
    assert len(resnet) == 1 and resnet[0]["precision"] == "bf16" and resnet[0]["batch_size"] == 4
    rand = [c for c in configs if c["spec"].startswith("random:")]
    from gnn_ptp import random_models

    small = [s for s in range(4) if random_models.param_count("mlp", s, {}) <= 1_000_000]
    assert {c["spec"] for c in rand} == {f"random:mlp:{s}" for s in small}
    assert len(rand) == len(small) * 2 * 2  # samples x precisions
    assert all(c["batch_size"] in (16, 64) and c["seq_len"] is None for c in rand)
    # round-robin: the first configurations come from every entry
    assert {configs[0]["spec"], configs[1]["spec"]} == {"hf:gpt2", "torchvision:resnet18"}
    assert load_grid(path) == (name, configs)  # deterministic


@pytest.mark.parametrize("text, match", [
    ('nmae = "x"', "unknown key 'nmae'.*did you mean 'name'"),
    ('[[model]]\nspec = "hf:gpt2"\nbatch = [2]', "unknown key 'batch'"),
    ('[[model]]\nspec = "hf:gpt2"\nprecisions = ["fp8"]', "unknown precision 'fp8'"),
    ('[[model]]\nspec = "hf:gpt2"\nprecisions = ["amp_bf16"]', "did you mean 'amp-bf16'"),
    ('[[model]]\nspec = "hf:gpt2"\noptimizers = ["lion"]', "unknown optimizer 'lion'"),
    ('[[model]]\nbatch_size = [2]', "missing 'spec'"),
    ('[[random]]\nkind = "rnn"', "kind must be one of"),
    ('[[random]]\nkind = "mlp"\nseeds = 5', "seeds must be"),
    ('precisions = [', "grid file"),
])
def test_grid_errors(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=match) as e:
        load_grid(path)
    assert "\n" not in str(e.value)


def test_missing_grid(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_grid(tmp_path / "nope.toml")


def test_real_grid_loads():
    name, configs = load_grid(Path(__file__).parent.parent / "training" / "grids" / "cpu.toml")
    assert name == "cpu" and len(configs) > 100


# --- DDP ------------------------------------------------------------------------------------------


def test_ddp_two_processes_gloo(grid, tmp_path):
    out = tmp_path / "cpu"
    grid.write_text(TINY_GRID.replace('["fp32", "bf16", "tf32"]', '["fp32"]').replace("[2, 4]", "[4]"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    # its own process group, so that a timeout kills torchrun's workers too (no orphaned ranks)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "gnn_ptp", "collect", "--ddp", "--grid", str(grid), "--out", str(out), *FAST_ARGS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"torchrun did not finish in 300 s:\n{stderr[-3000:]}")
    proc.stderr = stderr
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(records.iter_records(out / "tiny-ddp.jsonl"))
    assert len(rows) == 1, "only rank 0 writes"
    r = rows[0]
    assert r["status"] == "ok", r.get("error")
    assert r["ddp"]["world_size"] == 2 and r["ddp"]["backend"] == "gloo" and r["ddp"]["bucket_cap_mb"] == 25.0
    medians = r["ddp"]["per_rank_step_ms_median"]
    assert len(medians) == 2 and all(m > 0 for m in medians)
    assert r["key"] == records.config_key(r["config"], "cpu", r["ddp"])
    assert r["key"] != records.config_key(r["config"], "cpu")  # DDP records never collide with single runs
    print(f"DDP test took {elapsed:.1f} s")
