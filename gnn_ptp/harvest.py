"""The harvest: as many honest measurements as one short GPU loan allows.

A GPU is lent for minutes, not hours, so the collector's default loop spends them on timed steps:

- **One model per shape.** Configurations that differ only in precision class share one model, built
  once on the device in float32; the classes are swept over it in the order fp32, tf32, torch-default,
  amp-bf16, amp-fp16, and bf16 last (the model is then cast to bfloat16). Every record gets a fresh
  optimizer and GradScaler, so no state carries over; gc and the CUDA cache are cleared once per model.
- **Time-bounded timing.** 3 warm-up steps (synchronised once, to read their time), then as many timed
  steps as fit in ``harvest_time_s`` (0.3 s) by the warm-up's pace, between ``harvest_min_steps`` (5) and
  ``harvest_steps`` (20); each phase bracketed by CUDA events, one synchronisation at the end.
- **Out of memory is an answer.** Batch sizes run ascending; once a batch size runs out of memory in a
  precision class, larger batches of the same model and class are recorded as ``skipped`` (with the
  reason), never measured; grid ``[[skip]]`` rules (what cannot fit on 80 GB) are recorded the same way
  without touching the GPU.
- **amp-fp16 honesty.** The GradScaler's scale is read before and after the timed steps: a halving is a
  skipped optimizer step, and such a record is flagged (``flags``), not silently faster.
- **Per-op profiles.** One extra step under torch.profiler (CUDA activity on a GPU, CPU ops on a CPU),
  stored beside the records (``profiles.py``), for a sample that covers every family x precision class
  first and then keeps profiling within ``profile_share`` of the wall time.
- **Budgets that hold.** ``--budget-s`` counts from the process's own start (imports and CUDA start-up
  included); before each model and each record the harvest estimates its cost from the same family (the
  slowest seen when a family is new) and stops cleanly rather than overrun.
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from gnn_ptp import host_probe, optimizer_state, records
from gnn_ptp.collect import (CollectConfig, _is_oom, _label, _Progress, _raise_keyboard_interrupt,
                             _reset_cpu_peak, _StepTimer, failure, make_optimizer, memory_label, plan,
                             timing_summary, training_step)
from gnn_ptp.precision import get_precision
from gnn_ptp.spec import ModelSpec, Shape, _cast_floats, build, family_of

# fp32-parameter classes first, TF32 switches and autocast changing nothing about the model; bf16 casts
# the model, so it comes last.
SWEEP_ORDER = ("fp32", "tf32", "torch-default", "amp-bf16", "amp-fp16", "bf16")
FIRST_ESTIMATE_S = 30.0
"""What a record is assumed to cost before anything has been measured in this run."""
FIRST_PROFILE_S = 2.0
"""What a profiled step is assumed to cost before any has been measured."""
STOP_MARGIN_S = 3.0
PROFILE_CAP = 0.25
"""Profiling never takes more than this share of a harvest's time, coverage included."""
"""Kept free at the end of a budget for writing the last record and exiting."""


_IMPORTED_AT = time.perf_counter()


def process_elapsed_s() -> float:
    """Seconds since this process started (imports included), from the kernel's start time."""
    try:
        stat = open("/proc/self/stat").read()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        uptime_s = float(open("/proc/uptime").read().split()[0])
        return max(uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED_AT



def group_key(config: dict) -> tuple:
    """Configurations with the same group key share one model: they differ only in precision class."""
    return (config["spec"], json.dumps(config.get("set") or {}, sort_keys=True), config.get("task"), config["batch_size"], config.get("seq_len"), config.get("image_size"),
            config["optimizer"])


def _oom_key(config: dict) -> tuple:
    """A model and precision class regardless of batch size: where one OOM says larger batches will too."""
    g = group_key(config)
    return g[:3] + g[4:] + (config["precision"],)


def groups_of(todo: list[tuple[str, dict]]) -> list[list[tuple[str, dict]]]:
    """Group (key, config) pairs by model, in the order each group first appears in the grid, the
    precision classes of a group in SWEEP_ORDER."""
    groups: dict[tuple, list] = {}
    for key, config in todo:
        groups.setdefault(group_key(config), []).append((key, config))
    order = {name: i for i, name in enumerate(SWEEP_ORDER)}
    return [sorted(g, key=lambda kc: order[kc[1]["precision"]]) for g in groups.values()]


@dataclass
class CostBook:
    """What models and records have cost so far, per family: the budget's estimates."""

    build_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    record_s: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    profile_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def _slowest(self, table) -> float:
        values = [max(v) for v in table.values() if v]
        return max(values) if values else FIRST_ESTIMATE_S

    def build(self, family: str) -> float:
        seen = self.build_s.get(family)
        return max(seen) if seen else self._slowest(self.build_s)

    def record(self, family: str, precision: str) -> float:
        seen = self.record_s.get((family, precision))
        if seen:
            return max(seen)
        same_family = [max(v) for (f, _), v in self.record_s.items() if f == family and v]
        return max(same_family) if same_family else self._slowest(self.record_s)

    def profile(self, family: str) -> float:
        seen = self.profile_s.get(family)
        if seen:
            return max(seen)
        values = [max(v) for v in self.profile_s.values() if v]
        return max(values) if values else FIRST_PROFILE_S


@dataclass
class ProfilePolicy:
    """Which records get a profiled step (mode ``sample``): a record of a family x precision class not yet
    profiled, while profiling stays within PROFILE_CAP of the harvest's time (process start included);
    any other record while it stays within ``share``."""

    mode: str
    share: float
    per_cell: int = 1
    counts: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    spent_s: float = 0.0

    def wants(self, family: str, precision: str, elapsed_s: float, record_s: float, cost_s: float) -> bool:
        """``elapsed_s`` so far, ``record_s`` the record's own expected cost, ``cost_s`` its profile's."""
        if self.mode in ("none", "all"):
            return self.mode == "all"
        share_after = (self.spent_s + cost_s) / max(elapsed_s + record_s + cost_s, 1e-9)
        if self.counts[(family, precision)] < self.per_cell:
            return share_after <= PROFILE_CAP
        return share_after <= self.share

    def done(self, family: str, precision: str, seconds: float) -> None:
        self.counts[(family, precision)] += 1
        self.spent_s += seconds


class _Budget:
    def __init__(self, budget_s: float | None):
        self.budget_s = budget_s

    def allows(self, cost_s: float) -> bool:
        return self.budget_s is None or process_elapsed_s() + cost_s + STOP_MARGIN_S <= self.budget_s


def _oom_floor(held: list[dict]) -> dict[tuple, int]:
    """The smallest batch size that ran out of memory, per model and precision class."""
    floor: dict[tuple, int] = {}
    for r in held:
        if r.get("status") == "oom" and "config" in r:
            k = _oom_key(r["config"])
            floor[k] = min(floor.get(k, r["config"]["batch_size"]), r["config"]["batch_size"])
    return floor


def _skip_reason(config: dict, floor: dict[tuple, int]) -> str | None:
    rule = config.get("_skip")
    if rule:
        return f"grid rule: {rule}"
    smallest = floor.get(_oom_key(config))
    if smallest is not None and config["batch_size"] >= smallest:
        return (f"batch size {config['batch_size']} >= {smallest}, which ran out of memory in "
                f"{config['precision']}")
    return None


def measure_record(workload, config: dict, device: torch.device, cfg: CollectConfig, profiler=None) -> dict:
    """Time one precision class on a built model (already in the class's parameter dtype)."""
    precision = get_precision(config["precision"])
    model = workload.model
    start = time.perf_counter()
    result: dict = {"status": "ok", "error": None, "flags": []}
    optimizer = scaler = None
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        fresh_before = host_probe.fresh_fill(device)  # before the peak is reset: its buffers are no step's
        baseline_rss = _reset_cpu_peak() if device.type == "cpu" else 0
        optimizer = make_optimizer(config["optimizer"], model.parameters())
        scaler = torch.amp.GradScaler(device.type) if precision.grad_scaler else None
        losses: list[torch.Tensor] = []
        step = training_step(model, workload, optimizer, scaler, precision, device, losses)

        with precision.backend_flags():
            warm = _StepTimer(device)
            for _ in range(cfg.warmup_steps):
                marks: list = []
                step(warm, marks)
                warm.steps.append(marks)
            warm_ms = warm.durations_ms()["step_ms"] if cfg.warmup_steps else []  # synchronises
            pace_ms = warm_ms[-1] if warm_ms else None
            n = cfg.harvest_steps if not pace_ms else int(cfg.harvest_time_s * 1e3 / max(pace_ms, 1e-6))
            n = max(cfg.harvest_min_steps, min(cfg.harvest_steps, n))
            scale_before = scaler.get_scale() if scaler else None
            probe_before = host_probe.issue_us(device)
            timer = _StepTimer(device)
            losses.clear()
            timed_start = time.perf_counter()
            for _ in range(n):
                marks = []
                step(timer, marks)
                timer.steps.append(marks)
            durations = timer.durations_ms()  # the one synchronisation
            timed_s = time.perf_counter() - timed_start
            result["host_probe"] = host_probe.probe_fields(probe_before, host_probe.issue_us(device))
            result["optimizer_state"] = optimizer_state.zero_counts(optimizer)
            scale_after = scaler.get_scale() if scaler else None
            finite = bool(torch.isfinite(torch.stack([x.float() for x in losses])).all()) if losses else True
            profile_s = 0.0
            if profiler is not None:
                p_start = time.perf_counter()
                try:
                    optimizer.zero_grad(set_to_none=True)  # frees old gradients outside the profiled region
                    result["profile"] = profiler(step, resident=_resident_bytes(model, optimizer, workload))
                except KeyboardInterrupt:
                    raise
                except Exception as e:  # a profiler that fails costs the profile, never the measurement
                    if _is_oom(e):
                        raise
                    result["flags"].append("profile_failed")
                    result["profile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                profile_s = time.perf_counter() - p_start
        result["timing"] = timing_summary(durations, cfg.warmup_steps, warm_ms, device)
        if scaler:
            skipped = round(math.log2(scale_before / scale_after)) if scale_after < scale_before else 0
            result["grad_scaler"] = {"scale_before": scale_before, "scale_after": scale_after,
                                     "skipped_steps": skipped}
            if skipped:
                result["flags"].append("skipped_optimizer_steps")
        if not finite:
            result["flags"].append("nonfinite_loss")
        result["memory"] = memory_label(device, baseline_rss)
        if "host_probe" in result:  # after the memory label, which its buffers would raise
            result["host_probe"] = host_probe.with_fresh(result["host_probe"], fresh_before,
                                                         host_probe.fresh_fill(device))
        result["collector"] = {"mode": "harvest", "timed_s": round(timed_s, 4), "profile_s": round(profile_s, 4)}
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - every failure is information, recorded and moved past
        result = _failed(e)
    finally:
        del optimizer, scaler
        model.zero_grad(set_to_none=True)
        if result["status"] != "ok":  # free what the failed step held before the next class
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    result.setdefault("collector", {"mode": "harvest"})["wall_s"] = round(time.perf_counter() - start, 4)
    return result


def _resident_bytes(model, optimizer, workload):
    """What a step starts from (parameters, optimizer state, inputs), for the CPU's memory label; None
    where the memory model is not installed."""
    try:
        from gnn_ptp.memory import resident_bytes
    except ImportError:
        return None
    return lambda: resident_bytes(model, optimizer, workload.args, workload.kwargs, workload.targets)


def _failed(e: BaseException, prefix: str = "") -> dict:
    return {**failure(e, prefix), "flags": []}


def _build_on(config: dict, device: torch.device, param_dtype: torch.dtype):
    spec = ModelSpec.from_dict(config)
    shape = Shape(config["batch_size"], config.get("seq_len"), config.get("image_size"))
    return build(spec, shape, device, param_dtype)


def _to_bf16(workload) -> None:
    workload.model.to(torch.bfloat16)
    workload.args = tuple(_cast_floats(a, torch.bfloat16) for a in workload.args)
    workload.kwargs = {k: _cast_floats(v, torch.bfloat16) for k, v in workload.kwargs.items()}
    workload.targets = {k: _cast_floats(v, torch.bfloat16) for k, v in workload.targets.items()}


def harvest(cfg: CollectConfig) -> dict:
    """Measure the grid's remaining configurations as described in the module docstring."""
    from gnn_ptp import profiles

    p = plan(cfg)
    device, env, out = p.device, p.env, p.out
    groups = groups_of(p.todo)
    floor = _oom_floor(p.held)
    book = CostBook()
    policy = ProfilePolicy(cfg.profile, cfg.profile_share)
    for r in p.held:
        if r.get("profile"):
            policy.counts[(r.get("family") or "?", r["config"]["precision"])] += 1
    budget = _Budget(cfg.budget_s)
    profile_file = profiles.ProfileFile(out, p.grid_name) if cfg.profile != "none" else None
    counts = {"grid": len(p.configs), "already": 0 if cfg.repeat else len(p.configs) - len(p.todo),
              "ok": 0, "oom": 0, "error": 0, "skipped": 0, "skipped_precision": p.skipped_precision,
              "interrupted": False, "stopped_for_budget": False, "models": 0, "profiled": 0}
    print(f"gnn-ptp collect (harvest): {len(p.todo)} to measure in {len(groups)} models, {counts['already']} "
          f"already in {out} ({env['hardware']}: {env['device_name']}, torch {env['torch']})", file=sys.stderr)
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    progress = _Progress(len(p.todo), enabled=True)
    start = time.perf_counter()
    timed_total = 0.0
    profile_failures = 0

    def write(key: str, config: dict, result: dict, family: str) -> None:
        counts[result["status"]] += 1
        if result["status"] == "oom":  # larger batches of this model and class are skipped from now on
            k = _oom_key(config)
            floor[k] = min(floor.get(k, config["batch_size"]), config["batch_size"])
        record = {"schema": records.SCHEMA_VERSION, "id": uuid.uuid4().hex, "key": key,
                  "config": {k: config.get(k) for k in records.CONFIG_FIELDS}, "family": family, **result,
                  "env": env, "timestamp": records.now_utc(), "grid": p.grid_name, "tier": config.get("tier"),
                  "repeat": cfg.repeat}
        profile = record.pop("profile", None)
        if profile is not None and "peak_allocated_bytes" in profile and "memory" in record:
            # the CPU's memory label: bytes held before the step + the profiler's peak of what it allocated
            # (memory.CPU_LABEL_KIND), in place of the process's peak-RSS growth (kept for reference)
            rss = record["memory"]
            record["memory"] = {"peak_bytes": profile["peak_allocated_bytes"], "kind": "cpu_profiler_peak_allocated",
                                "resident_before_bytes": profile.get("resident_before_bytes"),
                                "rss_growth_bytes": rss.get("peak_bytes")}
        if profile is not None and profile_file is not None:
            record["profile"] = profile_file.append(record, profile)
            counts["profiled"] += 1
        records.append_record(record, out, p.file_name)
        progress.update(_label(config), result["status"])

    try:
        for group in groups:
            first = group[0][1]
            family = family_of(ModelSpec.from_dict(first))
            pending = []
            for key, config in group:
                reason = None if cfg.repeat else _skip_reason(config, floor)
                if reason:
                    write(key, config, {"status": "skipped", "error": reason, "flags": []}, family)
                else:
                    pending.append((key, config))
            if not pending:
                continue
            if not budget.allows(book.build(family) + book.record(family, pending[0][1]["precision"])):
                counts["stopped_for_budget"] = True
                break
            workload, built_dtype, build_s = None, None, 0.0
            build_failed: dict[torch.dtype, dict] = {}  # param dtype -> the failed build's result
            try:
                for key, config in pending:
                    precision = get_precision(config["precision"])
                    if precision.param_dtype in build_failed:  # the same model will not build twice
                        write(key, config, dict(build_failed[precision.param_dtype]), family)
                        continue
                    cost = book.record(family, precision.name)
                    if workload is None or built_dtype != precision.param_dtype:
                        cost += book.build(family)
                    profile_cost = book.profile(family)
                    profiling = profile_file is not None and policy.wants(
                        family, precision.name, process_elapsed_s(), cost, profile_cost)
                    if profiling and not budget.allows(cost + profile_cost):
                        profiling = False  # time for the record, not for its profile
                    if not budget.allows(cost):
                        counts["stopped_for_budget"] = True
                        break
                    if workload is not None and built_dtype != precision.param_dtype:
                        _to_bf16(workload)
                        built_dtype = precision.param_dtype
                    if workload is None:
                        b_start = time.perf_counter()
                        try:
                            workload = _build_on(config, device, precision.param_dtype)
                            built_dtype = precision.param_dtype
                        except KeyboardInterrupt:
                            raise
                        except BaseException as e:  # noqa: BLE001
                            result = _failed(e, "building the model: ")
                            result["collector"] = {"mode": "harvest", "wall_s": round(time.perf_counter() - b_start, 4)}
                            build_failed[precision.param_dtype] = result
                            write(key, config, dict(result), family)
                            gc.collect()
                            if device.type == "cuda":
                                torch.cuda.empty_cache()
                            continue
                        build_s = time.perf_counter() - b_start
                        book.build_s[family].append(build_s)
                        counts["models"] += 1
                    profiler = profiles.profiled_step(device) if profiling else None
                    result = measure_record(workload, config, device, cfg, profiler)
                    result["family"] = workload.family or family
                    result.update(modality=workload.modality, params=workload.param_count,
                                  shape={"batch_size": workload.shape.batch_size, "seq_len": workload.shape.seq_len,
                                         "image_size": workload.shape.image_size})
                    col = result["collector"]
                    col["build_s"] = round(build_s, 4)  # the model's, shared by its classes
                    col["overhead_s"] = round(col["wall_s"] - col.get("timed_s", 0.0) - col.get("profile_s", 0.0), 4)
                    book.record_s[(family, precision.name)].append(col["wall_s"] - col.get("profile_s", 0.0))
                    if "profile" in result:
                        book.profile_s[family].append(col["profile_s"])
                        policy.done(family, precision.name, col["profile_s"])
                    elif "profile_failed" in result.get("flags", ()):
                        profile_failures += 1
                        if profile_failures >= 2:  # the profiler does not work here: stop asking it
                            print(f"gnn-ptp collect: profiling failed twice ({result['profile_error']}); "
                                  "measuring on without profiles", file=sys.stderr)
                            profile_file = None
                    timed_total += col.get("timed_s", 0.0)
                    write(key, config, result, result.pop("family"))
            finally:
                del workload
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            if counts["stopped_for_budget"]:
                break
    except KeyboardInterrupt:
        counts["interrupted"] = True
    finally:
        progress.close()
        signal.signal(signal.SIGTERM, previous)
    elapsed = time.perf_counter() - start
    counts["elapsed_s"] = round(elapsed, 1)
    counts["process_s"] = round(process_elapsed_s(), 1)
    counts["timed_share"] = round(timed_total / elapsed, 3) if elapsed > 0 else 0.0
    counts["profile_share"] = round(policy.spent_s / elapsed, 3) if elapsed > 0 else 0.0
    why = " (interrupted)" if counts["interrupted"] else (
        " (stopped before the budget ran out)" if counts["stopped_for_budget"] else "")
    print(f"gnn-ptp collect (harvest): {counts['ok']} ok, {counts['oom']} oom, {counts['skipped']} skipped, "
          f"{counts['error']} error from {counts['models']} models in {counts['elapsed_s']} s "
          f"(process {counts['process_s']} s; timed steps {counts['timed_share']:.0%} of the wall time, "
          f"profiling {counts['profile_share']:.0%}){why}; records in {out / p.file_name}", file=sys.stderr)
    return counts
