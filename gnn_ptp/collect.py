"""Measure real training steps and append one record per configuration to ``datasets/<hardware>/``.

The label: one training step = ``zero_grad`` + forward + loss (inside autocast for AMP classes) +
backward + optimizer step (+ GradScaler scale/unscale/update under amp-fp16), inputs already on the
device, no data loading. After warm-up steps, timed steps run until both a minimum count and a minimum
time are reached; on a GPU each step is bracketed by CUDA events (forward | backward | optimizer), on a
CPU by a monotonic clock. Each phase and the whole step are stored as median, p10, p90 and n.

Nothing is lost: every record is appended atomically as soon as it is measured; an out-of-memory
configuration is recorded as ``oom`` and collection goes on; Ctrl-C or SIGTERM loses at most the
configuration in flight; a rerun skips what the folder already holds.

Under ``torchrun --nproc-per-node N -m gnn_ptp collect --ddp`` every rank measures a real
DistributedDataParallel step (nccl on GPUs, gloo on CPUs) and rank 0 writes the record.
"""

from __future__ import annotations

import gc
import math
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gnn_ptp import host_probe, optimizer_state, records
from gnn_ptp.collect_config import CollectConfig  # noqa: F401  (gnn_ptp.collect.CollectConfig, as before)
from gnn_ptp.errors import UserError
from gnn_ptp.grid import load_grid
from gnn_ptp.precision import CPU_PRECISIONS, get_precision
from gnn_ptp.spec import ModelSpec, Shape, build, family_of

PHASE_NAMES = ("forward", "backward", "optimizer")


def _quantiles(values: list[float]) -> dict:
    values = sorted(values)
    n = len(values)

    def q(p):
        if n == 1:
            return values[0]
        pos = p * (n - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return values[lo] + (values[hi] - values[lo]) * (pos - lo)

    return {"median": statistics.median(values), "p10": q(0.1), "p90": q(0.9), "n": n,
            "mean": statistics.fmean(values)}


class _StepTimer:
    """Marks four points of a step (start, after forward, after backward, after optimizer)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.steps: list[list] = []

    def mark(self, step: list) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            step.append(event)
        else:
            step.append(time.perf_counter())

    def durations_ms(self) -> dict[str, list[float]]:
        if self.cuda:
            torch.cuda.synchronize()
            diff = lambda a, b: a.elapsed_time(b)  # noqa: E731
        else:
            diff = lambda a, b: (b - a) * 1e3  # noqa: E731
        out = {"step_ms": [], "forward_ms": [], "backward_ms": [], "optimizer_ms": []}
        for marks in self.steps:
            out["step_ms"].append(diff(marks[0], marks[3]))
            for i, phase in enumerate(PHASE_NAMES):
                out[f"{phase}_ms"].append(diff(marks[i], marks[i + 1]))
        return out


def _reset_cpu_peak() -> int:
    """Reset the kernel's peak-RSS counter for this process; return the current RSS in bytes."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _proc_status("VmRSS")


def _proc_status(field: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _agree(stop: bool, ddp: dict | None) -> bool:
    """Under DDP every rank must run the same number of steps (each step is a collective): rank 0's
    decision is everyone's. Without this, ranks whose clocks disagree at the threshold deadlock."""
    if not ddp:
        return stop
    import torch.distributed as dist

    flag = [stop]
    dist.broadcast_object_list(flag, src=0)
    return bool(flag[0])


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    text = str(e).lower()
    return "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text


def failure(e: BaseException, prefix: str = "") -> dict:
    """How a configuration ended when it raised: ``oom`` or ``error``, with the first line of why."""
    return {"status": "oom" if _is_oom(e) else "error",
            "error": f"{prefix}{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]}


def timing_summary(durations: dict[str, list[float]], warmup_steps: int, warm_ms: list[float],
                   device: torch.device) -> dict:
    """A record's ``timing``: median, p10, p90, n, mean per phase and step, and how it was clocked."""
    timing = {name: _quantiles(values) for name, values in durations.items()}
    timing.update(warmup_steps=warmup_steps, warmup_step_ms=warm_ms,
                  clock="cuda_events" if device.type == "cuda" else "perf_counter")
    return timing


def memory_label(device: torch.device, baseline_rss: int) -> dict:
    """A record's ``memory``: CUDA's peak allocated and reserved bytes since the last reset, or on a CPU
    the growth of the process's peak RSS over ``baseline_rss``."""
    if device.type == "cuda":
        return {"peak_bytes": torch.cuda.max_memory_allocated(device),
                "peak_reserved_bytes": torch.cuda.max_memory_reserved(device), "kind": "cuda_max_memory_allocated"}
    peak = _proc_status("VmHWM")
    return {"peak_bytes": max(peak - baseline_rss, 0), "peak_rss_bytes": peak, "baseline_rss_bytes": baseline_rss,
            "kind": "cpu_rss_high_water_mark"}


def _profiled_cpu_peak(model, optimizer, workload, step) -> dict:
    """This rank's peak allocated bytes over one more training step on a CPU: the tensors resident before
    it (local shards of DTensors) plus the peak of torch.profiler's memory events during it
    (``memory.measure_cpu_peak``'s method, kind ``cpu_profiler_peak_allocated``)."""
    from torch.profiler import ProfilerActivity, profile

    from gnn_ptp.memory import CPU_LABEL_KIND, profiler_peak_bytes, resident_bytes

    optimizer.zero_grad(set_to_none=True)
    resident = resident_bytes(model, optimizer, (workload.args, workload.kwargs, workload.targets))
    timer = _StepTimer(torch.device("cpu"))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(timer, [])
    profiled = profiler_peak_bytes(prof)
    return {"peak_bytes": resident + profiled, "resident_bytes": resident, "profiled_peak_bytes": profiled,
            "kind": CPU_LABEL_KIND}


def make_optimizer(name: str, params):
    """torch.optim with its defaults for the device (foreach on GPUs, single-tensor on CPUs)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def training_step(model, workload, optimizer, scaler, precision, device: torch.device, losses: list | None = None):
    """One training step as both collectors time it, ``step(timer, marks)``: zero_grad, forward + loss
    under the class's autocast, backward (of the scaled loss under a GradScaler), optimizer step (through
    the scaler), with ``timer.mark(marks)`` before, between and after the three phases. ``losses``, when
    given, collects each step's loss (detached)."""
    autocast = dict(device_type=device.type, dtype=precision.autocast_dtype or torch.float32,
                    enabled=precision.uses_autocast)

    def step(timer, marks: list) -> None:
        timer.mark(marks)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(**autocast):
            output = model(*workload.args, **workload.kwargs)
            loss = workload.loss_fn(output, **workload.targets)
        timer.mark(marks)
        (scaler.scale(loss) if scaler else loss).backward()
        timer.mark(marks)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        timer.mark(marks)
        if losses is not None:
            losses.append(loss.detach())

    return step


def measure(config: dict, device: torch.device, cfg: CollectConfig, ddp: dict | None) -> dict:
    """Build and time one configuration. Returns the measurement part of its record."""
    start = time.perf_counter()
    spec = ModelSpec.from_dict(config)
    shape = Shape(config["batch_size"], config.get("seq_len"), config.get("image_size"))
    precision = get_precision(config["precision"])
    result: dict = {"status": "ok", "error": None, "family": family_of(spec)}
    workload = model = optimizer = scaler = None
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        fresh_before = host_probe.fresh_fill(device)  # before the peak is reset: its buffers are no step's
        baseline_rss = _reset_cpu_peak()
        workload = build(spec, shape, device, precision.param_dtype)
        model = workload.model
        result.update(family=workload.family, modality=workload.modality, params=workload.param_count,
                      shape={"batch_size": workload.shape.batch_size, "seq_len": workload.shape.seq_len,
                             "image_size": workload.shape.image_size})
        if ddp and ddp.get("parallel", "ddp") != "ddp":  # FSDP2: every block of the largest stack, then the root
            from torch.distributed.fsdp import fully_shard

            from gnn_ptp.fsdp import find_blocks

            blocks = find_blocks(model)
            reshard = ddp["parallel"] == "fsdp"
            if blocks.stack is not None:
                for block in model.get_submodule(blocks.stack):
                    fully_shard(block, reshard_after_forward=reshard)
            fully_shard(model, reshard_after_forward=reshard)
            result["fsdp"] = {"blocks": len(blocks.block_params), "stack": blocks.stack}
        elif ddp:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=cfg.bucket_cap_mb)
        optimizer = make_optimizer(config["optimizer"], model.parameters())
        scaler = torch.amp.GradScaler(device.type) if precision.grad_scaler else None
        step = training_step(model, workload, optimizer, scaler, precision, device)

        with precision.backend_flags():
            built = time.perf_counter()
            warm = _StepTimer(device)
            for _ in range(cfg.warmup_steps):
                marks: list = []
                step(warm, marks)
                warm.steps.append(marks)
            warm_ms = warm.durations_ms()["step_ms"] if cfg.warmup_steps else []
            if device.type == "cuda":
                torch.cuda.synchronize()
            overhead_s = time.perf_counter() - start
            # long enough that build + warm-up stay under overhead_target of the wall time
            want_s = max(cfg.min_time_s, overhead_s * (1 - cfg.overhead_target) / cfg.overhead_target)
            want_s = min(want_s, cfg.max_time_s)
            probe_before = host_probe.issue_us(device)
            timer = _StepTimer(device)
            timed_start = time.perf_counter()
            while True:
                marks = []
                step(timer, marks)
                timer.steps.append(marks)
                n = len(timer.steps)
                if n >= cfg.max_steps:
                    break
                if n >= cfg.min_steps and n % 5 == 0:
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    if _agree(time.perf_counter() - timed_start >= want_s, ddp):
                        break
            durations = timer.durations_ms()
            timed_s = time.perf_counter() - timed_start
            result["host_probe"] = host_probe.probe_fields(probe_before, host_probe.issue_us(device))
            result["optimizer_state"] = optimizer_state.zero_counts(optimizer)
        result["timing"] = timing_summary(durations, cfg.warmup_steps, warm_ms, device)
        result["memory"] = memory_label(device, baseline_rss)
        if ddp and ddp.get("parallel", "ddp") != "ddp" and device.type == "cpu":
            # FSDP on a CPU: one more step under the profiler gives this rank's allocated peak (the RSS
            # growth above holds gloo's buffers and the model build too); kept beside the RSS figures
            rss = result["memory"]
            result["memory"] = {**rss, "rss_peak_growth_bytes": rss["peak_bytes"],
                                **_profiled_cpu_peak(model, optimizer, workload, step)}
        if "host_probe" in result:  # after the memory label, which its buffers would raise
            result["host_probe"] = host_probe.with_fresh(result["host_probe"], fresh_before,
                                                         host_probe.fresh_fill(device))
        result["collector"] = {"build_s": round(built - start, 4), "overhead_s": round(overhead_s, 4),
                               "timed_s": round(timed_s, 4)}
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - every failure is information, recorded and moved past
        result.update(failure(e))
        result.pop("timing", None)
    finally:
        del workload, model, optimizer, scaler
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result.setdefault("collector", {})["wall_s"] = round(time.perf_counter() - start, 4)
    return result


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def update(self, label: str, status: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"ETA {_hms(eta)}  {status:<5} {label}")
        print(("\r" + line[:160].ljust(160)) if self.tty else line, end="" if self.tty else "\n",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _label(config: dict) -> str:
    dims = f"b{config['batch_size']}" + (f" s{config['seq_len']}" if config.get("seq_len") else "") + (
        f" {config['image_size']}px" if config.get("image_size") else "")
    sets = ",".join(f"{k}={v}" for k, v in (config.get("set") or {}).items())
    return f"{config['spec']}{'[' + sets + ']' if sets else ''} {dims} {config['precision']} {config['optimizer']}"


def _validate_specs(configs: list[dict]) -> None:
    """Build every distinct model of the run on the meta device first: a typo in a grid fails here, in
    a second, with the grid's own words, instead of as an error record per configuration."""
    seen = set()
    for config in configs:
        spec = ModelSpec.from_dict(config)
        if spec in seen:
            continue
        seen.add(spec)
        shape = Shape(config["batch_size"], config.get("seq_len"), config.get("image_size"))
        build(spec, shape, "meta")


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


@dataclass
class Plan:
    """What a collection run will do: where, on what, and which configurations are left to measure."""

    device: torch.device
    env: dict
    out: Path
    grid_name: str
    file_name: str
    configs: list[dict]
    """Every configuration of the grid this device can run."""
    todo: list[tuple[str, dict]]
    """(key, config) still to measure, in grid order."""
    held: list[dict]
    """The records the folder already holds."""
    skipped_precision: int
    ddp: dict | None
    rank: int = 0
    world: int = 1


def plan(cfg: CollectConfig) -> Plan:
    """Set up the device (and the process group under --ddp), check the folder, read the grid and the
    records already held; no measuring."""
    ddp = None
    rank, world = 0, 1
    if cfg.ddp:
        import datetime

        import torch.distributed as dist

        if "RANK" not in os.environ:
            raise UserError("--ddp runs under torchrun: torchrun --nproc-per-node N -m gnn_ptp collect --ddp ...")
        use_cuda = torch.cuda.is_available() and cfg.device != "cpu"
        backend = "nccl" if use_cuda else "gloo"
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
        rank, world = dist.get_rank(), dist.get_world_size()
        ddp = {"world_size": world, "backend": backend, "bucket_cap_mb": cfg.bucket_cap_mb}
        if cfg.parallel != "ddp":
            ddp["parallel"] = cfg.parallel
    else:
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA GPU is visible")
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    if cfg.threads and device.type == "cpu":
        torch.set_num_threads(cfg.threads)

    env = records.environment(device)
    hardware = env["hardware"]
    out = Path(cfg.out)
    # CPU kinds differ (records carry env.cpu_kind); each kind may have its own folder cpu-<kind>
    cpu_kind_folder = hardware == "cpu" and out.name.startswith("cpu-")
    if out.name != hardware and not cpu_kind_folder and not cfg.allow_dir_mismatch:
        raise UserError(f"--out {cfg.out}: this machine is {hardware!r} ({env['device_name']}); its records "
                        f"belong in a folder named {hardware!r} (e.g. datasets/{hardware}"
                        f"{', or cpu-<kind> for one CPU kind' if hardware == 'cpu' else ''}); "
                        "--allow-dir-mismatch to override")
    name, configs = load_grid(cfg.grid)
    skipped_precision = 0
    if device.type == "cpu":
        kept = [c for c in configs if c["precision"] in CPU_PRECISIONS]
        skipped_precision = len(configs) - len(kept)
        configs = kept
    file_name = f"{name}{'-' + ddp.get('parallel', 'ddp') if ddp else ''}.jsonl"
    held = list(records.iter_records(out)) if out.exists() else []
    done = {r["key"]: r["status"] for r in held if "key" in r}
    retried = ("error", "skipped") if cfg.retry_errors else ()
    todo = []
    for config in configs:
        key = records.config_key(config, hardware, ddp)
        if cfg.repeat:
            if done.get(key) == "ok":
                todo.append((key, config))
            continue
        if key in done and done[key] not in retried:
            continue
        todo.append((key, config))
    if cfg.limit is not None:
        todo = todo[:cfg.limit]
    _validate_specs([config for _, config in todo])
    return Plan(device, env, out, name, file_name, configs, todo, held, skipped_precision, ddp, rank, world)


def collect(cfg: CollectConfig) -> dict:
    """Run the grid; return counts of what was measured. See the module docstring."""
    if cfg.harvest:
        from gnn_ptp.harvest import harvest

        return harvest(cfg)
    p = plan(cfg)
    device, env, out, name, todo, ddp, rank, world = p.device, p.env, p.out, p.grid_name, p.todo, p.ddp, p.rank, p.world
    file_name, hardware = p.file_name, env["hardware"]
    counts = {"grid": len(p.configs), "already": 0 if cfg.repeat else len(p.configs) - len(todo), "ok": 0, "oom": 0,
              "error": 0, "skipped_precision": p.skipped_precision, "interrupted": False, "stopped_for_budget": False}
    if rank == 0:
        print(f"gnn-ptp collect: {len(todo)} to measure, {counts['already']} already in {out} "
              f"({hardware}: {env['device_name']}, torch {env['torch']})", file=sys.stderr)
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    progress = _Progress(len(todo), enabled=rank == 0)
    start = time.perf_counter()
    walls: list[float] = []
    try:
        for key, config in todo:
            expected = statistics.fmean(walls) if walls else 0.0
            go = cfg.budget_s is None or time.perf_counter() - start + expected <= cfg.budget_s
            if ddp:
                import torch.distributed as dist

                flag = [go]
                dist.broadcast_object_list(flag, src=0)
                go = flag[0]
            if not go:
                counts["stopped_for_budget"] = True
                break
            result = measure(config, device, cfg, ddp)
            walls.append(result["collector"]["wall_s"])
            if ddp:
                import torch.distributed as dist

                medians = [None] * world
                mine = result.get("timing", {}).get("step_ms", {}).get("median")
                dist.all_gather_object(medians, mine)
                result["ddp"] = {**ddp, "per_rank_step_ms_median": medians}
            counts[result["status"]] += 1
            if rank == 0:
                record = {"schema": records.SCHEMA_VERSION, "key": key,
                          "config": {k: config.get(k) for k in records.CONFIG_FIELDS}, **result,
                          "env": env, "timestamp": records.now_utc(), "grid": name, "repeat": cfg.repeat}
                records.append_record(record, out, file_name)
            progress.update(_label(config), result["status"])
    except KeyboardInterrupt:
        counts["interrupted"] = True
    finally:
        progress.close()
        signal.signal(signal.SIGTERM, previous)
        if ddp:
            from gnn_ptp.process_group import leave_together

            leave_together()
    counts["elapsed_s"] = round(time.perf_counter() - start, 1)
    if rank == 0:
        why = " (interrupted)" if counts["interrupted"] else (
            " (stopped before the budget ran out)" if counts["stopped_for_budget"] else "")
        print(f"gnn-ptp collect: {counts['ok']} ok, {counts['oom']} oom, {counts['error']} error in "
              f"{counts['elapsed_s']} s{why}; records in {out / file_name}", file=sys.stderr)
    return counts
