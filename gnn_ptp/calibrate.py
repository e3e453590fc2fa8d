"""``gnn-ptp calibrate-comm``: measure all-reduce times on your own machines and write an interconnect
profile that ``predict --interconnect FILE`` and ``comm --interconnect FILE`` read.

Two ways to run it:
- on a cluster, under torchrun (NCCL on GPUs, gloo otherwise): every rank joins the job's process group,
  rank 0 writes the profile. One node gives the intra-node level, several nodes the inter-node level;
  run it once per shape you care about (8 GPUs on 1 node, then 32 on 4) with the same ``--out`` and the
  fits are merged into one file;
- on one machine, without torchrun: it starts ``--procs`` gloo worlds itself (e.g. 2 and 4 processes).

What is measured: out-of-place-equivalent ``all_reduce`` of float32 tensors (sum) from ``--min-bytes``
to ``--max-bytes`` in steps of 2x; for each size a few warm-up calls, then as many timed calls as fill
``--min-time-s`` (the count agreed by all ranks), the time per call being the slowest rank's mean, as
nccl-tests reports it. The alpha-beta line of ``comm.fit_fabric`` is fitted on sizes >= ``--fit-min-bytes``
with every third size held out, and the held-out error is printed. The raw rows go into the profile.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gnn_ptp.errors import UserError


@dataclass
class CalibrateConfig:
    out: Path
    name: str = ""
    """Profile name (default: the file's stem)."""
    procs: tuple[int, ...] = (2,)
    """World sizes to start on this machine when not under torchrun."""
    min_bytes: int = 4 << 10
    max_bytes: int = 64 << 20
    min_time_s: float = 0.2
    """Timed calls per size fill at least this long (and at least ``min_iters``)."""
    min_iters: int = 5
    warmup_iters: int = 2
    fit_min_bytes: int = 1 << 20
    """The line is fitted from here up (DDP's buckets: 1 MiB first, 25 MiB after)."""
    description: str = ""
    hardware: tuple[str, ...] = ()
    """Hardware labels (as in datasets/<hardware>) this profile is the default interconnect for."""

    def validate(self) -> None:
        """Before any process starts: the size range and the fit range."""
        self.sizes()
        if not self.min_bytes <= self.fit_min_bytes <= self.max_bytes:
            raise UserError(f"--fit-min-bytes {self.fit_min_bytes} is outside --min-bytes {self.min_bytes} .. "
                            f"--max-bytes {self.max_bytes}")

    def sizes(self) -> list[int]:
        if self.min_bytes < 4 or self.max_bytes < self.min_bytes:
            raise UserError(f"--min-bytes {self.min_bytes} / --max-bytes {self.max_bytes}: need 4 <= min <= max")
        out, n = [], self.min_bytes
        while n <= self.max_bytes:
            out.append(n)
            n *= 2
        return out


def measure_allreduce(sizes: list[int], min_time_s: float, min_iters: int, warmup_iters: int) -> list[dict]:
    """Time ``all_reduce`` at every size in the current process group; every rank returns the same rows."""
    import torch
    import torch.distributed as dist

    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def agree(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    rows = []
    world = dist.get_world_size()
    for nbytes in sizes:
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        for _ in range(warmup_iters):
            dist.all_reduce(buf)
        sync()
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buf)
        sync()
        probe_s = agree(time.perf_counter() - start)
        iters = int(agree(max(min_iters, math.ceil(min_time_s / max(probe_s, 1e-6)))))
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        sync()
        per_call_us = agree((time.perf_counter() - start) / iters * 1e6)
        rows.append({"gpus": world, "message_bytes": nbytes, "time_us": per_call_us, "iters": iters})
    return rows


def _reference_work(seconds: float) -> float:
    """Run a fixed mix of training-like work (a compute-bound matmul and a memory-bound elementwise pass
    over 32 MB) for ``seconds``; return rounds per second."""
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    x, y = torch.randn(8 << 20), torch.randn(8 << 20)
    rounds, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(4):
            a = torch.tanh(a @ b)
        x.mul_(0.999).add_(y)
        rounds += 1
    return rounds / elapsed


def measure_node_sharing(seconds: float = 3.0) -> dict:
    """How ranks on one machine slow each other down, measured in the current (gloo) process group:
    - ``compute_slowdown``: the reference work's speed on rank 0 alone (the others idle) over its mean
      speed when every rank runs it at once (cores, caches and memory bandwidth shared);
    - ``copy_GBps``: one rank's memory copy bandwidth while every rank copies (DDP copies each gradient
      into its bucket and the result back: two copies of every gradient byte a step, on the compute
      thread, with gradient_as_bucket_view=False, the default)."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    alone = torch.tensor([_reference_work(seconds) if dist.get_rank() == 0 else 0.0], dtype=torch.float64)
    dist.barrier()
    together = torch.tensor([_reference_work(seconds)], dtype=torch.float64)
    dist.all_reduce(alone)
    dist.all_reduce(together)
    together /= dist.get_world_size()
    src, dst = torch.ones(16 << 20 >> 2), torch.empty(16 << 20 >> 2)
    dist.barrier()
    copies, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds / 2:
        dst.copy_(src)
        copies += 1
    bw = torch.tensor([copies * (16 << 20) / elapsed / 1e9], dtype=torch.float64)
    dist.all_reduce(bw)
    return {"compute_slowdown": float(alone / together), "copy_GBps": float(bw) / dist.get_world_size()}


def _spawned_world(rank: int, world: int, init_file: str, out_file: str, cfg: CalibrateConfig) -> None:
    import json

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=10))
    try:
        sharing = measure_node_sharing()
        rows = measure_allreduce(cfg.sizes(), cfg.min_time_s, cfg.min_iters, cfg.warmup_iters)
        if rank == 0:
            Path(out_file).write_text(json.dumps({"rows": rows, "sharing": sharing}))
    finally:
        dist.destroy_process_group()


def _run_local(cfg: CalibrateConfig) -> list[dict]:
    import json

    import torch.multiprocessing as mp

    rows, sharing = [], {}
    for world in cfg.procs:
        if world < 2:
            raise UserError(f"--procs {world}: an all-reduce needs at least 2 processes")
        with tempfile.TemporaryDirectory(prefix="gnn-ptp-calibrate-") as tmp:
            init_file, out_file = os.path.join(tmp, "store"), os.path.join(tmp, "rows.json")
            mp.start_processes(_spawned_world, args=(world, init_file, out_file, cfg), nprocs=world,
                               start_method="spawn")
            got = json.loads(Path(out_file).read_text())
        rows += got["rows"]
        sharing[str(world)] = got["sharing"]
        print(f"measured {world} gloo processes on this machine: compute "
              f"{got['sharing']['compute_slowdown']:.2f}x slower than alone, copies at "
              f"{got['sharing']['copy_GBps']:.1f} GB/s a rank", flush=True)
    return rows, sharing


def _environment(backend: str, world: int, nodes: int) -> dict:
    import torch

    env = {"backend": backend, "world_size": world, "nodes": nodes, "host": platform.node(),
           "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
           "torch": torch.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
               timespec="seconds")}
    if backend == "nccl":
        env.update(device_name=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
    return env


def _fit(rows: list[dict], world: int, level_name: str, cfg: CalibrateConfig, algorithm: str,
         max_gpus: int | None):
    from gnn_ptp import comm

    tagged = [{**r, "source": f"gnn-ptp calibrate-comm ({algorithm})", "fabric": level_name} for r in rows]
    try:
        return comm.fit_fabric(f"{level_name}-{world}", cfg.description or f"{level_name}, {world} ranks", tagged,
                               gpus=world, max_gpus=max_gpus, fit_range_bytes=(cfg.fit_min_bytes, cfg.max_bytes),
                               algorithm=algorithm)
    except ValueError as e:
        raise UserError(f"{e}; measure larger messages (--max-bytes) or longer (--min-time-s)") from None


def _merge(cfg: CalibrateConfig, intra: list, inter: list, rows: list[dict], env: dict, gpus_per_node: int,
           overlap: bool, compute_slots: int | None, sharing: dict | None = None):
    from gnn_ptp import interconnect

    name = cfg.name or cfg.out.stem
    old = check_out(cfg)
    if old is not None:  # keep what was measured before: fits at other world sizes, their rows
        new_sizes = {(r["gpus"], "inter" if inter else "intra") for r in rows}
        intra = [f for f in old.intra if (f.measured_gpus, "intra") not in new_sizes] + intra
        inter = [f for f in old.inter if (f.measured_gpus, "inter") not in new_sizes] + inter
        kept = [r for r in old.measurements if (r["gpus"], r.get("level", "intra")) not in new_sizes]
        rows = kept + rows
        gpus_per_node = max(gpus_per_node, old.gpus_per_node)
        sharing = {**old.node_sharing, **(sharing or {})}
    return interconnect.Interconnect(
        name=name, description=cfg.description or f"calibrated on {env.get('host', '?')} ({env['backend']})",
        gpus_per_node=gpus_per_node, intra=tuple(sorted(intra, key=lambda f: f.measured_gpus)),
        inter=tuple(sorted(inter, key=lambda f: f.measured_gpus)), overlap=overlap, compute_slots=compute_slots,
        source="gnn-ptp calibrate-comm", env=env, measurements=tuple(rows), node_sharing=sharing or {},
        hardware=tuple(cfg.hardware) or (old.hardware if old is not None else ()))


def check_out(cfg: CalibrateConfig):
    """Before measuring: ``--out`` must be a writable file path, and an existing file there must be an
    interconnect profile (its fits at other world sizes are merged, never overwritten). Returns the
    existing profile or None."""
    import json

    from gnn_ptp import interconnect
    from gnn_ptp.paths import check_output_file

    check_output_file(cfg.out, "--out", overwrite=True)
    if not cfg.out.exists():
        return None
    try:
        return interconnect.Interconnect.from_dict(json.loads(cfg.out.read_text()))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        raise UserError(f"--out {cfg.out} exists and is not an interconnect profile: not overwriting it") \
            from None


def calibrate(cfg: CalibrateConfig):
    """Measure, fit, write ``cfg.out`` (merged with what it held) and return the profile; under torchrun
    every rank measures and only rank 0 writes (other ranks return None)."""
    from gnn_ptp import interconnect

    cfg.sizes()  # validate before starting processes
    if cfg.fit_min_bytes > cfg.max_bytes:
        raise UserError(f"--fit-min-bytes {cfg.fit_min_bytes} is above --max-bytes {cfg.max_bytes}")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
        try:
            world = dist.get_world_size()
            per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            nodes = max(1, world // per_node)
            rows = measure_allreduce(cfg.sizes(), cfg.min_time_s, cfg.min_iters, cfg.warmup_iters)
            if dist.get_rank() != 0:
                return None
        finally:
            dist.destroy_process_group()
        level = "intra" if nodes == 1 else "inter"
        rows = [{**r, "level": level} for r in rows]
        algorithm = f"{backend} (fitted line)"
        fit = _fit(rows, world, level, cfg, algorithm, per_node if nodes == 1 else None)
        env = _environment(backend, world, nodes)
        cpu = backend == "gloo"
        profile = _merge(cfg, [fit] if nodes == 1 else [], [fit] if nodes > 1 else [], rows, env, per_node,
                         overlap=not cpu, compute_slots=env["cpu_count"] if cpu else None)
    else:
        rows, sharing = _run_local(cfg)
        rows = [{**r, "level": "intra"} for r in rows]
        env = _environment("gloo", max(cfg.procs), 1)
        fits = [_fit([r for r in rows if r["gpus"] == w], w, "gloo-loopback", cfg, "gloo (fitted line)", None)
                for w in cfg.procs]
        profile = _merge(cfg, fits, [], rows, env, max(cfg.procs), overlap=False, compute_slots=env["cpu_count"],
                         sharing=sharing)
    interconnect.write(profile, cfg.out)
    return profile


def format_profile(profile) -> str:
    from gnn_ptp import comm

    lines = [f"interconnect {profile.name}: {profile.description}",
             f"  {profile.gpus_per_node} ranks per node; all-reduce overlaps the backward: "
             f"{'yes' if profile.overlap else 'no'}"
             + (f"; compute slots per node: {profile.compute_slots}" if profile.compute_slots else "")]
    for ranks, sh in sorted(profile.node_sharing.items(), key=lambda kv: int(kv[0])):
        lines.append(f"  {ranks} ranks on one node: compute {sh['compute_slowdown']:.2f}x slower than one rank "
                     f"alone (measured), memory copies at {sh['copy_GBps']:.1f} GB/s a rank")
    for level, fits in (("intra-node", profile.intra), ("inter-node", profile.inter)):
        for f in fits:
            rows = [r for r in profile.measurements if r["gpus"] == f.measured_gpus]
            lines.append(f"  {level} fit at {f.measured_gpus} ranks:")
            lines += ["    " + line for line in comm.describe_fabric(f, rows)]
    return "\n".join(lines)


def config_from_args(args) -> CalibrateConfig:
    fields = {f.name for f in dataclasses.fields(CalibrateConfig)}
    return CalibrateConfig(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
