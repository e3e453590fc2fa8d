"""The harvest loop on the CPU (the same loop a GPU runs): one model per shape, the sweep order, fresh
optimizers, time-bounded timing, OOM floors and skip rules, GradScaler flags, profiles, budgets; and the
H100 grid's shape (tiers, families, random architectures, skip rules)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from gnn_ptp import cli, harvest as harvest_mod, profiles, records
from gnn_ptp.collect import CollectConfig, collect
from gnn_ptp.errors import UserError
from gnn_ptp.grid import load_grid
from gnn_ptp.spec import Workload

FAST = dict(warmup_steps=1, harvest_steps=4, harvest_min_steps=2, harvest_time_s=0.02, threads=1, device="cpu",
            mode="harvest")

GRID = """
name = "tiny"
precisions = ["fp32", "bf16", "amp-bf16", "tf32"]   # tf32 means nothing on a CPU: left out there
optimizers = ["adamw"]

[[model]]
spec = "random:mlp:3"
set = { in_features = 16, width = 32, depth = 2, num_classes = 4, dropout = 0.0, norm = "none" }
batch_size = [4, 2]

[[model]]
spec = "hf:gpt2"
set = { n_layer = 1, n_embd = 32, n_head = 2, vocab_size = 100 }
batch_size = [2]
seq_len = [8]
"""
MLP_SET = '{ in_features = 16, width = 32, depth = 2, num_classes = 4, dropout = 0.0, norm = "none" }'


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def grid(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(GRID)
    return path


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "cpu"


def run(grid, out, **kw) -> dict:
    return collect(CollectConfig(str(grid), str(out), **{**FAST, **kw}))


def read(out: Path) -> list[dict]:
    return list(records.iter_records(out))


def test_harvest_builds_one_model_per_shape_and_sweeps_the_classes(grid, out, monkeypatch):
    built = []
    real_build = harvest_mod.build

    def counting_build(spec, shape, device="meta", param_dtype=torch.float32):
        built.append((spec.spec, shape.batch_size, param_dtype))
        return real_build(spec, shape, device, param_dtype)

    monkeypatch.setattr(harvest_mod, "build", counting_build)
    counts = run(grid, out, profile="all")
    assert counts["ok"] == 9 and counts["models"] == 3 and counts["skipped_precision"] == 3
    assert len(built) == 3 and all(dtype == torch.float32 for *_, dtype in built)  # bf16 is a cast, not a build
    rows = read(out)
    assert len(rows) == 9 and len({r["id"] for r in rows}) == 9
    # batch sizes ascending within the entry; within a model the sweep order, bf16 last
    mlp = [(r["config"]["batch_size"], r["config"]["precision"]) for r in rows if r["config"]["spec"] == "random:mlp:3"]
    assert mlp == [(2, "fp32"), (2, "amp-bf16"), (2, "bf16"), (4, "fp32"), (4, "amp-bf16"), (4, "bf16")]
    for r in rows:
        assert r["schema"] == records.SCHEMA_VERSION and r["status"] == "ok" and r["flags"] == []
        assert set(r["config"]) == set(records.CONFIG_FIELDS) and r["tier"] == 1
        t = r["timing"]
        assert 2 <= t["step_ms"]["n"] <= 4 and t["warmup_steps"] == 1 and t["clock"] == "perf_counter"
        assert 0 < t["step_ms"]["p10"] <= t["step_ms"]["median"] <= t["step_ms"]["p90"]
        c = r["collector"]
        assert c["mode"] == "harvest" and c["wall_s"] >= c["timed_s"] > 0 and c["build_s"] >= 0
        assert c["overhead_s"] == pytest.approx(c["wall_s"] - c["timed_s"] - c["profile_s"], abs=1e-3)
        assert r["params"] > 0 and r["env"]["hardware"] == "cpu"
        assert r["profile"]["file"].startswith("profiles/tiny-") and r["profile"]["events"] > 0
        probe = r["host_probe"]  # the host's issue cost around the timed steps (gnn_ptp/host_probe.py)
        assert 0 < probe["issue_us_before"] < 1e4 and 0 < probe["issue_us_after"] < 1e4 and probe["op"] == "add_"
        assert probe["fresh_ms_per_mib_before"] >= 0 and probe["fresh_faults_per_mib"] > 0  # host_probe.fresh_fill
        moments = r["optimizer_state"]["exp_avg_sq"]  # AdamW's, counted after the timed steps
        assert moments["elements"] == r["params"] and 0 <= moments["zeros"] <= moments["elements"]
    from gnn_ptp.memory import CPU_LABEL_KIND, check_records

    assert all(r["memory"]["kind"] == CPU_LABEL_KIND and r["memory"]["peak_bytes"] > 0 for r in rows)
    judged = check_records(out)  # the analytic memory model against these real CPU labels
    assert len(judged) == 9
    from gnn_ptp.stats import dataset_stats

    collected = dataset_stats(out)["collection"]
    assert collected["harvest"]["records"] == 9 and collected["profiled"] == 9
    assert 0 < collected["harvest"]["timed_share"] < 1 and collected["harvest"]["records_per_min"] > 0


def test_profiles_hold_the_ops_of_each_phase(grid, out):
    run(grid, out, profile="all")
    rows = read(out)
    by_id = profiles.read_profiles(out)
    assert set(by_id) == {r["id"] for r in rows}
    for r in rows:
        p = by_id[r["id"]]
        assert p["schema"] == profiles.PROFILE_SCHEMA and p["key"] == r["key"] and p["device"] == "cpu"
        assert p["columns"] == list(profiles.COLUMNS) and len(p["ops"]) == r["profile"]["events"]
        names = [p["names"][row[0]] for row in p["ops"]]
        phases = {row[2] for row in p["ops"]}
        assert {0, 1, 2} <= phases  # forward, backward and optimizer ops were all seen
        forward = {p["names"][row[0]] for row in p["ops"] if row[2] == 0}
        assert forward & {"aten::addmm", "aten::mm", "aten::linear"}
        if r["config"]["precision"] == "bf16":
            dtypes = {d for row in p["ops"] for d in p["sigs"][row[1]][1]}
            assert "c10::BFloat16" in dtypes or "BFloat16" in str(dtypes)
        for row in p["ops"]:
            assert -1 <= row[3] < len(names)  # parents index rows
    # every profile file is a gzip stream of JSON lines
    for path in (out / "profiles").iterdir():
        with gzip.open(path, "rt") as f:
            assert all(json.loads(line)["schema"] == 1 for line in f)


def test_sampled_profiles_cover_every_family_and_class_first(grid, out):
    run(grid, out, profile="sample", profile_share=0.0)  # share 0: coverage only
    rows = read(out)
    cells = {(r["family"], r["config"]["precision"]) for r in rows}
    profiled = [(r["family"], r["config"]["precision"]) for r in rows if r.get("profile")]
    assert set(profiled) == cells and len(profiled) == len(cells)  # one each, no more
    # a second run at another batch size profiles nothing new: the records say what is covered
    more = grid.read_text().replace("batch_size = [4, 2]", "batch_size = [4, 2, 8]")
    grid.write_text(more)
    run(grid, out, profile="sample", profile_share=0.0)
    assert len([r for r in read(out) if r.get("profile")]) == len(cells)
    assert run(grid, out, profile="none")["ok"] == 0  # nothing left to measure


def test_oom_skips_larger_batches_of_that_class(grid, out, monkeypatch):
    real = harvest_mod.measure_record

    def oom_at_batch_2_bf16(workload, config, device, cfg, profiler=None):
        if config["batch_size"] == 2 and config["precision"] == "bf16" and config["spec"] == "random:mlp:3":
            return {**harvest_mod._failed(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")),
                    "collector": {"mode": "harvest", "wall_s": 0.01}}
        return real(workload, config, device, cfg, profiler)

    monkeypatch.setattr(harvest_mod, "measure_record", oom_at_batch_2_bf16)
    counts = run(grid, out, profile="none")
    assert counts["oom"] == 1 and counts["skipped"] == 1 and counts["ok"] == 7
    by = {(r["config"]["spec"], r["config"]["batch_size"], r["config"]["precision"]): r for r in read(out)}
    assert by[("random:mlp:3", 2, "bf16")]["status"] == "oom"
    skipped = by[("random:mlp:3", 4, "bf16")]
    assert skipped["status"] == "skipped" and "timing" not in skipped
    assert "batch size 4 >= 2, which ran out of memory in bf16" in skipped["error"]
    assert by[("random:mlp:3", 4, "fp32")]["status"] == "ok"  # other classes go on
    assert by[("hf:gpt2", 2, "bf16")]["status"] == "ok"  # other models too
    # a rerun neither measures the oom again nor the skipped one; --retry-errors retries the skipped
    assert run(grid, out, profile="none")["ok"] == 0
    again = run(grid, out, profile="none", retry_errors=True)
    assert again["skipped"] == 1 and again["ok"] == 0  # still below an OOM: skipped again, not measured


def test_failed_build_is_recorded_once_per_parameter_dtype(grid, out, monkeypatch):
    real_build = harvest_mod.build
    calls = []

    def build(spec, shape, device="meta", param_dtype=torch.float32):
        if torch.device(device).type != "meta" and spec.spec == "hf:gpt2":
            calls.append(param_dtype)
            if param_dtype == torch.float32:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")
        return real_build(spec, shape, device, param_dtype)

    monkeypatch.setattr(harvest_mod, "build", build)
    run(grid, out, profile="none")
    gpt2 = {r["config"]["precision"]: r for r in read(out) if r["config"]["spec"] == "hf:gpt2"}
    assert gpt2["fp32"]["status"] == gpt2["amp-bf16"]["status"] == "oom"
    assert gpt2["fp32"]["error"].startswith("building the model: OutOfMemoryError")
    assert gpt2["bf16"]["status"] == "ok"  # built in bfloat16 directly
    assert calls == [torch.float32, torch.bfloat16]


def test_grid_skip_rules_are_recorded_without_building(grid, out, monkeypatch):
    grid.write_text(GRID + f"""
[[skip]]
spec = "random:mlp:3"
set = {MLP_SET}
batch_size_min = 4
precisions = ["fp32", "amp-bf16", "bf16"]
torch_below = "99.0"
reason = "too big for this test"
""")
    built = []
    real_build = harvest_mod.build
    monkeypatch.setattr(harvest_mod, "build", lambda spec, shape, device="meta", param_dtype=torch.float32: (
        built.append(shape.batch_size) or real_build(spec, shape, device, param_dtype)))
    counts = run(grid, out, profile="none")
    assert counts["skipped"] == 3 and counts["ok"] == 6 and 4 not in built
    skipped = [r for r in read(out) if r["status"] == "skipped"]
    assert all(r["error"] == "grid rule: too big for this test" for r in skipped)
    # a rule for an older torch than this one covers nothing
    grid.write_text(grid.read_text().replace('torch_below = "99.0"', 'torch_below = "1.0"'))
    name, configs = load_grid(grid)
    assert not any("_skip" in c for c in configs)


def _overflowing_workload():
    """A synthetic model whose scaled loss overflows float32 gradients: every amp-fp16 step is skipped."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    x = torch.randn(4, 8)
    return Workload(model, (x,), {}, {}, lambda out: out.float().sum() * 1e36, "test", "tabular")


def test_grad_scaler_skipped_steps_are_flagged():
    cfg = CollectConfig("g", "o", **FAST)
    config = {"precision": "amp-fp16", "optimizer": "adamw", "batch_size": 4}
    result = harvest_mod.measure_record(_overflowing_workload(), config, torch.device("cpu"), cfg)
    assert result["status"] == "ok", result["error"]
    n = result["timing"]["step_ms"]["n"]
    gs = result["grad_scaler"]
    assert gs["skipped_steps"] == n and gs["scale_after"] == gs["scale_before"] / 2 ** n
    assert "skipped_optimizer_steps" in result["flags"]
    # a well-behaved loss skips nothing and is not flagged
    w = _overflowing_workload()
    w.loss_fn = lambda out: out.float().pow(2).mean() * 1e-4  # scaled gradients stay far inside float16
    fine = harvest_mod.measure_record(w, config, torch.device("cpu"), cfg)
    assert fine["grad_scaler"]["skipped_steps"] == 0 and fine["flags"] == []


def test_time_bound_picks_the_step_count_from_the_warm_up():
    w = _overflowing_workload()
    w.loss_fn = lambda out: out.float().pow(2).mean()
    config = {"precision": "fp32", "optimizer": "sgd", "batch_size": 4}
    few = CollectConfig("g", "o", **{**FAST, "harvest_steps": 20, "harvest_min_steps": 5, "harvest_time_s": 1e-9})
    many = CollectConfig("g", "o", **{**FAST, "harvest_steps": 20, "harvest_min_steps": 5, "harvest_time_s": 100.0})
    assert harvest_mod.measure_record(w, config, torch.device("cpu"), few)["timing"]["step_ms"]["n"] == 5
    assert harvest_mod.measure_record(w, config, torch.device("cpu"), many)["timing"]["step_ms"]["n"] == 20


def test_budget_counts_from_process_start_and_never_overruns(grid, out, monkeypatch):
    clock = {"now": 0.0}
    monkeypatch.setattr(harvest_mod, "process_elapsed_s", lambda: clock["now"])
    real = harvest_mod.measure_record

    def hundred_seconds(*args, **kwargs):
        result = real(*args, **kwargs)
        clock["now"] += 100.0
        result["collector"]["wall_s"] = 100.0
        return result

    monkeypatch.setattr(harvest_mod, "measure_record", hundred_seconds)
    counts = run(grid, out, profile="none", budget_s=250.0)
    assert counts["stopped_for_budget"] and counts["ok"] == 2 and clock["now"] <= 250.0
    # start-up already past the budget: nothing starts
    clock["now"] = 1000.0
    counts = run(grid, out, profile="none", budget_s=250.0)
    assert counts["stopped_for_budget"] and counts["ok"] == 0


def test_cost_book_estimates_from_the_family():
    book = harvest_mod.CostBook()
    assert book.record("llama", "fp32") == harvest_mod.FIRST_ESTIMATE_S  # nothing seen yet
    book.record_s[("resnet", "fp32")] += [1.0, 2.0]
    book.record_s[("llama", "bf16")] += [40.0]
    assert book.record("resnet", "fp32") == 2.0  # its own family and class: the slowest seen
    assert book.record("resnet", "amp-bf16") == 2.0  # its family, another class
    assert book.record("vit", "fp32") == 40.0  # a new family: the slowest of all
    book.build_s["resnet"] += [0.5]
    assert book.build("resnet") == 0.5 and book.build("vit") == 0.5


def test_process_elapsed_counts_imports():
    assert harvest_mod.process_elapsed_s() > 0.5  # torch's import alone takes longer than that


def test_torn_profile_member_is_skipped_with_warning(tmp_path, capsys):
    folder = tmp_path / "profiles"
    folder.mkdir()
    whole = gzip.compress(json.dumps({"id": "a", "ops": []}).encode() + b"\n")
    torn = gzip.compress(json.dumps({"id": "b", "ops": []}).encode() + b"\n")[:-9]
    (folder / "x-000.jsonl.gz").write_bytes(whole + torn)
    assert set(profiles.read_profiles(tmp_path)) == {"a"}
    assert "unreadable" in capsys.readouterr().err


def test_collect_config_checks_harvest_fields():
    for bad in (dict(mode="fast"), dict(profile="some"), dict(profile_share=1.5), dict(harvest_min_steps=0),
                dict(harvest_steps=2, harvest_min_steps=5), dict(harvest_time_s=0), dict(budget_s=-1.0),
                dict(mode="harvest", ddp=True)):
        with pytest.raises(UserError):
            CollectConfig("g", "o", **bad)
    assert CollectConfig("g", "o").harvest and not CollectConfig("g", "o", ddp=True).harvest


def test_cli_dry_run_prints_the_plan(capsys):
    grid = Path(__file__).parent.parent / "training" / "grids" / "h100.toml"
    code = cli.main(["collect", "--grid", str(grid), "--out", "datasets/h100", "--dry-run"])
    text = capsys.readouterr().out
    assert code == 0 and "tier 1:" in text and "every one in all six precision classes" in text
    assert "hf:llama* 1.1G" in text


def test_cli_dry_run_of_the_cpu_grid(tmp_path, capsys):
    """The CPU grid's --set values include lists (swin's depths): the plan keys models by their repr."""
    grid = Path(__file__).parent.parent / "training" / "grids" / "cpu.toml"
    code = cli.main(["collect", "--grid", str(grid), "--out", str(tmp_path / "cpu"), "--dry-run"])
    text = capsys.readouterr().out
    assert code == 0 and "399 configurations" in text and "hf:swin* 304k" in text


# --- the H100 grid ---------------------------------------------------------------------------------


def test_h100_grid_is_tiered_and_balanced(monkeypatch):
    name, configs = load_grid(Path(__file__).parent.parent / "training" / "grids" / "h100.toml")
    from gnn_ptp.spec import ModelSpec, family_of

    assert name == "h100" and len(configs) >= 2000
    tiers = [c["tier"] for c in configs]
    assert tiers == sorted(tiers) and set(tiers) == {1, 2, 3}
    fam = lambda c: family_of(ModelSpec.from_dict(c))  # noqa: E731
    tier1 = [c for c in configs if c["tier"] == 1]
    families = {fam(c) for c in configs}
    assert {fam(c) for c in tier1} == families and len(families) >= 17
    for family in families:  # every family in all six classes in tier 1 alone
        assert {c["precision"] for c in tier1 if fam(c) == family} == set(records_precisions())
    # the first configurations already mix named models and random architectures
    head = {c["spec"].split(":")[0] for c in tier1[:60]}
    assert {"hf", "torchvision", "random"} <= head
    randoms = {c["spec"] for c in configs if c["spec"].startswith("random:")}
    assert len(randoms) >= 300
    batch_sizes = {}
    for c in configs:
        if not c["spec"].startswith("random:"):
            batch_sizes.setdefault((c["spec"], json.dumps(c["set"], sort_keys=True)), set()).add(c["batch_size"])
    assert all(4 <= len(b) <= 6 for b in batch_sizes.values())
    # the skip rules apply only below torch 2.14 (the device image has 2.11)
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    _, old = load_grid(Path(__file__).parent.parent / "training" / "grids" / "h100.toml")
    skipped = [c for c in old if "_skip" in c]
    assert skipped and all(c["spec"] == "hf:llama" and c["precision"] in ("fp32", "tf32", "torch-default")
                           and c["batch_size"] >= 8 for c in skipped)
    monkeypatch.setattr(torch, "__version__", "2.14.1")
    _, new = load_grid(Path(__file__).parent.parent / "training" / "grids" / "h100.toml")
    assert not any("_skip" in c for c in new)


def records_precisions():
    from gnn_ptp.precision import PRECISION_NAMES

    return PRECISION_NAMES


def test_models_with_list_overrides_group(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\nprecisions = ["fp32", "bf16"]\n[[model]]\nspec = "hf:swin"\n'
                    'set = { embed_dim = 16, depths = [1, 1], num_heads = [1, 2], patch_size = 4, window_size = 4, '
                    'num_labels = 10 }\nbatch_size = [2]\nimage_size = [32]\n')
    counts = run(grid, tmp_path / "cpu", profile="none")
    assert counts["ok"] == 2 and counts["models"] == 1


def test_profile_policy_covers_first_and_stays_within_its_share():
    policy = harvest_mod.ProfilePolicy("sample", share=0.1)
    # an uncovered cell is profiled while profiling stays under the 25 % cap...
    assert policy.wants("llama", "fp32", elapsed_s=100.0, record_s=5.0, cost_s=20.0)
    policy.done("llama", "fp32", 20.0)
    # ...a covered one only under the share
    assert not policy.wants("llama", "fp32", elapsed_s=125.0, record_s=5.0, cost_s=20.0)
    assert policy.wants("llama", "fp32", elapsed_s=1000.0, record_s=5.0, cost_s=20.0)
    # coverage never breaks the cap
    assert not policy.wants("vit", "bf16", elapsed_s=125.0, record_s=5.0, cost_s=60.0)
    assert harvest_mod.ProfilePolicy("all", 0.0).wants("x", "fp32", 0.0, 1.0, 100.0)
    assert not harvest_mod.ProfilePolicy("none", 1.0).wants("x", "fp32", 1e9, 1.0, 0.0)


def test_a_failing_profiler_costs_the_profile_not_the_measurement(grid, out, monkeypatch):
    calls = []

    def broken(device):
        def run(step, resident=None):
            calls.append(1)
            raise RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES")
        return run

    monkeypatch.setattr(profiles, "profiled_step", broken)
    counts = run(grid, out, profile="all")
    rows = read(out)
    assert counts["ok"] == 9 and all(r["status"] == "ok" and "timing" in r for r in rows)
    failed = [r for r in rows if "profile_failed" in r["flags"]]
    assert len(failed) == 2 and len(calls) == 2  # after two failures the harvest stops asking
    assert "CUPTI_ERROR" in failed[0]["profile_error"] and not any(r.get("profile") for r in rows)


def test_profiling_overhead_benchmark_reads_back_to_back_slices(tmp_path):
    """benchmarks/profiling_overhead.py on SYNTHETIC slices: the profiled slices' steps are 1.1x the
    unprofiled ones', which it reports as the effect; a folder without records is one line, exit 2."""
    import subprocess
    import sys

    def write(folder, factor, profiled):
        folder.mkdir()
        with open(folder / "cpu.jsonl", "w") as f:
            for i in range(12):
                rec = {"key": f"k{i}", "status": "ok", "config": {"precision": ["fp32", "bf16"][i % 2]},
                       "timing": {"step_ms": {"median": (10 + i) * factor}}, "synthetic": True}
                if profiled:
                    rec["profile"] = {"file": "profiles/x.jsonl.gz"}
                f.write(json.dumps(rec) + "\n")

    for name, factor, profiled in (("n1", 1.0, False), ("p1", 1.1, True), ("n2", 1.0, False), ("p2", 1.1, True)):
        write(tmp_path / name, factor, profiled)
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "profiling_overhead.py"
    run = subprocess.run([sys.executable, str(script), "--unprofiled", str(tmp_path / "n1"), str(tmp_path / "n2"),
                          "--profiled", str(tmp_path / "p1"), str(tmp_path / "p2")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "12 configurations in every slice" in run.stdout and "all1 12, all2 12" in run.stdout
    assert "profiled / unprofiled (geometric means of the slices, per configuration): median 1.100" in run.stdout
    assert "none2 / none1: median 1.000" in run.stdout
    (tmp_path / "empty").mkdir()
    bad = subprocess.run([sys.executable, str(script), "--unprofiled", str(tmp_path / "empty"),
                          "--profiled", str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nowhere" in bad.stderr
