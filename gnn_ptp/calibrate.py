"""``gnn-ptp calibrate-comm``: measure all-reduce times on your own machines and write an interconnect
profile that ``predict --interconnect FILE`` and ``comm --interconnect FILE`` read.

Two ways to run it:
- on a cluster, under torchrun (NCCL on GPUs, gloo otherwise): every rank joins the job's process group,
  rank 0 writes the profile. One node gives the intra-node level, several nodes the inter-node level;
  run it once per shape you care about (8 GPUs on 1 node, then 32 on 4) with the same ``--out`` and the
  fits are merged into one file;
- on one machine, without torchrun: it starts ``--procs`` gloo worlds itself (e.g. 2 and 4 processes).

What is measured: out-of-place-equivalent ``all_reduce`` of float32 tensors (sum) from ``--min-bytes``
to ``--max-bytes`` in steps of 2x (with ``--collectives``, also or instead the all-gather and
reduce-scatter FSDP2 calls, ``all_gather_single`` and ``reduce_scatter_single`` (the ``*_tensor`` names on
torch before them), the sizes being the unsharded tensor's, as FSDP issues them); for each size a few
warm-up calls, then as many timed calls as fill ``--min-time-s`` (the count agreed by all ranks), the time
per call being the slowest rank's mean, as nccl-tests reports it. The alpha-beta line of ``comm.fit_fabric``
is fitted on sizes >= ``--fit-min-bytes`` with every third size held out, and the held-out error is printed.
The other collectives get two lines each (below ``--fit-min-bytes`` and from it up: FSDP's per-block
messages are often small), stored beside the all-reduce levels. The raw rows go into the profile.
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
from gnn_ptp.process_group import leave_together


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
    fsdp: bool = False
    """Also measure FSDP2's host overheads on synthetic stacks (gnn_ptp/fsdp_overheads.py; one machine,
    gloo, without torchrun)."""
    collectives: tuple[str, ...] = ("all_reduce",)
    """Which collectives to measure (all_reduce, all_gather, reduce_scatter). Fits of collectives not
    measured now are kept from an existing ``--out``; the node-sharing figures come with all_reduce."""

    def validate(self) -> None:
        """Before any process starts: the size range, the fit range and the collectives."""
        from gnn_ptp.interconnect import COLLECTIVES

        bad = [c for c in self.collectives if c not in COLLECTIVES]
        if bad or not self.collectives:
            raise UserError(f"--collectives {','.join(self.collectives) or '(none)'}: allowed "
                            f"{', '.join(COLLECTIVES)} (comma-separated)")
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
    return measure_collective("all_reduce", sizes, min_time_s, min_iters, warmup_iters)


def measure_collective(kind: str, sizes: list[int], min_time_s: float, min_iters: int, warmup_iters: int) \
        -> list[dict]:
    """Time one collective at every size (the unsharded tensor's bytes) in the current process group, the
    call count agreed by all ranks; every rank returns the same rows."""
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

    # the calls FSDP2 makes: torch 2.14 names them *_single (the *_tensor names warn there); older torch has
    # only the *_tensor names
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    rows = []
    world = dist.get_world_size()
    for nbytes in sizes:
        numel = max(world, nbytes // 4 // world * world)
        buf = torch.ones(numel, dtype=torch.float32, device=device)
        shard = torch.ones(numel // world, dtype=torch.float32, device=device)
        if kind == "all_reduce":
            def call():
                dist.all_reduce(buf)
        elif kind == "all_gather":
            def call():
                all_gather(buf, shard)
        else:
            def call():
                reduce_scatter(shard, buf)
        for _ in range(warmup_iters):
            call()
        sync()
        dist.barrier()
        start = time.perf_counter()
        call()
        sync()
        probe_s = agree(time.perf_counter() - start)
        iters = int(agree(max(min_iters, math.ceil(min_time_s / max(probe_s, 1e-6)))))
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        sync()
        per_call_us = agree((time.perf_counter() - start) / iters * 1e6)
        rows.append({"gpus": world, "message_bytes": nbytes, "time_us": per_call_us, "iters": iters,
                     "collective": kind})
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


def measure_node_sharing(seconds: float = 1.5, rounds: int = 5) -> dict:
    """How ranks on one machine slow each other down, measured in the current (gloo) process group:
    - ``compute_slowdown``: the reference work's speed on rank 0 alone (the others idle) over its mean
      speed when every rank runs it at once (cores, caches and memory bandwidth shared), measured in
      ``rounds`` rounds of ``seconds`` alone then ``seconds`` together, the median of the rounds' ratios
      (``compute_slowdown_rounds``: one 3 s pair moved by 13-20 % from call to call on a 2-core VM, at 4
      ranks 2.04-2.64x in five calls in a row);
    - ``copy_GBps``: one rank's memory copy bandwidth while every rank copies (DDP copies each gradient
      into its bucket and the result back: two copies of every gradient byte a step, on the compute
      thread, with gradient_as_bucket_view=False, the default)."""
    import statistics

    import torch
    import torch.distributed as dist

    ratios = []
    for _ in range(rounds):
        dist.barrier()
        alone = torch.tensor([_reference_work(seconds) if dist.get_rank() == 0 else 0.0], dtype=torch.float64)
        dist.barrier()
        together = torch.tensor([_reference_work(seconds)], dtype=torch.float64)
        dist.all_reduce(alone)
        dist.all_reduce(together)
        ratios.append(float(alone / (together / dist.get_world_size())))
    src, dst = torch.ones(16 << 20 >> 2), torch.empty(16 << 20 >> 2)
    dist.barrier()
    copies, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        dst.copy_(src)
        copies += 1
    bw = torch.tensor([copies * (16 << 20) / elapsed / 1e9], dtype=torch.float64)
    dist.all_reduce(bw)
    return {"compute_slowdown": statistics.median(ratios), "compute_slowdown_rounds": ratios,
            "copy_GBps": float(bw) / dist.get_world_size()}


def _spawned_world(rank: int, world: int, init_file: str, out_file: str, cfg: CalibrateConfig) -> None:
    import json

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=10))
    try:
        sharing = measure_node_sharing() if "all_reduce" in cfg.collectives else None
        rows = _measure_all(cfg)
        stacks = None
        if cfg.fsdp:
            from gnn_ptp import fsdp_overheads

            stacks = {"stacks": fsdp_overheads.measure(), "fresh": fsdp_overheads.measure_fresh()}
        if rank == 0:
            Path(out_file).write_text(json.dumps({"rows": rows, "sharing": sharing, "fsdp_stacks": stacks}))
    finally:
        leave_together()


def _run_local(cfg: CalibrateConfig) -> list[dict]:
    import json

    import torch.multiprocessing as mp

    rows, sharing, stacks = [], {}, {}
    for world in cfg.procs:
        if world < 2:
            raise UserError(f"--procs {world}: an all-reduce needs at least 2 processes")
        with tempfile.TemporaryDirectory(prefix="gnn-ptp-calibrate-") as tmp:
            init_file, out_file = os.path.join(tmp, "store"), os.path.join(tmp, "rows.json")
            mp.start_processes(_spawned_world, args=(world, init_file, out_file, cfg), nprocs=world,
                               start_method="spawn")
            got = json.loads(Path(out_file).read_text())
        rows += got["rows"]
        if got.get("fsdp_stacks"):
            stacks[world] = got["fsdp_stacks"]
        if got["sharing"] is not None:
            sharing[str(world)] = got["sharing"]
            print(f"measured {world} gloo processes on this machine: compute "
                  f"{got['sharing']['compute_slowdown']:.2f}x slower than alone, copies at "
                  f"{got['sharing']['copy_GBps']:.1f} GB/s a rank", flush=True)
    return rows, sharing, stacks


def _measure_all(cfg: CalibrateConfig) -> list[dict]:
    rows = []
    for kind in cfg.collectives:
        rows += measure_collective(kind, cfg.sizes(), cfg.min_time_s, cfg.min_iters, cfg.warmup_iters)
    return rows


def _fit_collectives(rows: list[dict], world: int, level: str, cfg: CalibrateConfig, backend: str,
                     max_gpus: int | None) -> dict:
    """{kind: {level: [Fabric]}} for the measured all-gather and reduce-scatter rows at ``world`` ranks: two
    lines split at ``--fit-min-bytes`` (the small-message line from ``--min-bytes``)."""
    from gnn_ptp import comm

    out = {}
    for kind in ("all_gather", "reduce_scatter"):
        sel = [{**r, "source": f"gnn-ptp calibrate-comm ({backend} {kind})", "fabric": level}
               for r in rows if r.get("collective") == kind and r["gpus"] == world]
        if not sel:
            continue
        split = cfg.fit_min_bytes if cfg.min_bytes < cfg.fit_min_bytes else None
        args = dict(gpus=world, max_gpus=max_gpus, fit_range_bytes=(cfg.min_bytes, cfg.max_bytes))
        try:
            fit = comm.fit_fabric(f"{level}-{kind}-{world}", f"{kind}, {world} ranks", sel, **args,
                                  algorithm=f"{backend} {kind} (fitted lines)", split_bytes=split)
        except ValueError:  # small messages all latency (no slope below the split): one line for all sizes
            try:
                fit = comm.fit_fabric(f"{level}-{kind}-{world}", f"{kind}, {world} ranks", sel, **args,
                                      algorithm=f"{backend} {kind} (fitted line)")
            except ValueError as e:
                raise UserError(f"{e}; measure larger messages (--max-bytes) or longer (--min-time-s)") from None
        out[kind] = {level: [fit]}
    return out


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
           overlap: bool, compute_slots: int | None, sharing: dict | None = None, collectives: dict | None = None):
    from gnn_ptp import interconnect

    name = cfg.name or cfg.out.stem
    old = check_out(cfg)
    collectives = collectives or {}
    reduce_measured = any(r.get("collective", "all_reduce") == "all_reduce" for r in rows)
    if old is not None:  # keep what was measured before: fits at other world sizes or of other collectives
        new = {(r["gpus"], r.get("level", "intra"), r.get("collective", "all_reduce")) for r in rows}
        intra = [f for f in old.intra if (f.measured_gpus, "intra", "all_reduce") not in new] + intra
        inter = [f for f in old.inter if (f.measured_gpus, "inter", "all_reduce") not in new] + inter
        kept = [r for r in old.measurements
                if (r["gpus"], r.get("level", "intra"), r.get("collective", "all_reduce")) not in new]
        rows = kept + rows
        for kind, levels in old.collectives.items():
            for level, fits in levels.items():
                keep = [f for f in fits if (f.measured_gpus, level, kind) not in new]
                collectives.setdefault(kind, {}).setdefault(level, [])
                collectives[kind][level] = keep + list(collectives[kind][level])
        gpus_per_node = max(gpus_per_node, old.gpus_per_node)
        sharing = {**old.node_sharing, **(sharing or {})}
        if not reduce_measured:  # the all-reduce's environment stays; this run's is kept beside it
            env = {**old.env, "collectives_env": env}
    elif not intra and not inter:
        raise UserError(f"--collectives {','.join(cfg.collectives)}: a new profile needs the all-reduce too; "
                        "add all_reduce (or extend an existing --out profile)")
    collectives = {kind: {level: tuple(sorted(fits, key=lambda f: f.measured_gpus)) for level, fits in levels.items()}
                   for kind, levels in collectives.items()}
    return interconnect.Interconnect(
        name=name, description=cfg.description or f"calibrated on {env.get('host', '?')} ({env['backend']})",
        gpus_per_node=gpus_per_node, intra=tuple(sorted(intra, key=lambda f: f.measured_gpus)),
        inter=tuple(sorted(inter, key=lambda f: f.measured_gpus)), overlap=overlap, compute_slots=compute_slots,
        source="gnn-ptp calibrate-comm", env=env, measurements=tuple(rows), node_sharing=sharing or {},
        hardware=tuple(cfg.hardware) or (old.hardware if old is not None else ()), collectives=collectives,
        fsdp=dict(old.fsdp) if old is not None else {})


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
        if cfg.fsdp:
            raise UserError("--fsdp measures on one machine: run it without torchrun (it starts --procs gloo "
                            "processes itself)")
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
            rows = _measure_all(cfg)
            if dist.get_rank() != 0:
                return None
        finally:
            leave_together()
        level = "intra" if nodes == 1 else "inter"
        rows = [{**r, "level": level} for r in rows]
        algorithm = f"{backend} (fitted line)"
        reduce_rows = [r for r in rows if r["collective"] == "all_reduce"]
        fit = _fit(reduce_rows, world, level, cfg, algorithm, per_node if nodes == 1 else None) \
            if reduce_rows else None
        env = _environment(backend, world, nodes)
        cpu = backend == "gloo"
        fits = [fit] if fit is not None else []
        profile = _merge(cfg, fits if nodes == 1 else [], fits if nodes > 1 else [], rows, env, per_node,
                         overlap=not cpu, compute_slots=env["cpu_count"] if cpu else None,
                         collectives=_fit_collectives(rows, world, level, cfg, backend,
                                                      per_node if nodes == 1 else None))
    else:
        rows, sharing, stacks = _run_local(cfg)
        rows = [{**r, "level": "intra"} for r in rows]
        profile = _local_profile(cfg, rows, _environment("gloo", max(cfg.procs), 1), sharing, stacks)
    interconnect.write(profile, cfg.out)
    return profile


def _local_profile(cfg: CalibrateConfig, rows: list[dict], env: dict, sharing: dict, stacks: dict):
    """The profile of gloo processes on one machine (``cfg.procs``) from their measured ``rows``: a line
    per world size and collective, merged with ``cfg.out`` (``_merge``), and where ``stacks`` holds FSDP2's
    synthetic stacks per world size (``{"stacks", "fresh"}``) the overheads fitted to them."""
    fits = [_fit([r for r in rows if r["gpus"] == w and r["collective"] == "all_reduce"], w, "gloo-loopback",
                 cfg, "gloo (fitted line)", None)
            for w in cfg.procs] if "all_reduce" in cfg.collectives else []
    collectives: dict = {}
    for w in cfg.procs:
        for kind, levels in _fit_collectives(rows, w, "intra", cfg, "gloo", None).items():
            collectives.setdefault(kind, {}).setdefault("intra", []).extend(levels["intra"])
    profile = _merge(cfg, fits, [], rows, env, max(cfg.procs), overlap=False, compute_slots=env["cpu_count"],
                     sharing=sharing, collectives=collectives)
    if stacks:
        from gnn_ptp import fsdp_overheads

        measured = {str(w): {**fsdp_overheads.fit(got["stacks"], profile, int(w), got["fresh"]), "raw": got["stacks"]}
                    for w, got in stacks.items()}
        profile = dataclasses.replace(profile, fsdp={**profile.fsdp, **measured})
    return profile


def pool(cfg: CalibrateConfig, runs: list[Path]):
    """One profile from several ``calibrate-comm`` runs on the same machine (without torchrun, the same
    world sizes and collectives): per world size, collective and message size the median of the runs'
    times; per world size the median of their node-sharing figures and fresh-buffer costs; the lines and
    FSDP2's overheads fitted again from the pooled times and from every run's synthetic stacks together.
    Repeated runs disagree (on a 2-core VM the 4-rank host overheads by up to 2x), and pooling uses each
    without choosing the one whose predictions score better. Writes ``cfg.out`` (merged as ``calibrate``
    does) and returns the profile."""
    import json
    import statistics

    from gnn_ptp import interconnect

    if len(runs) < 2:
        raise UserError(f"--pool {' '.join(map(str, runs))}: give two or more profile files of runs to pool")
    loaded = []
    for path in runs:
        try:
            loaded.append(interconnect.Interconnect.from_dict(json.loads(Path(path).read_text())))
        except FileNotFoundError:
            raise UserError(f"--pool {path}: no such file") from None
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            raise UserError(f"--pool {path}: not an interconnect profile (calibrate-comm writes them)") from None

    def worlds(p) -> set:
        return {r["gpus"] for r in p.measurements}

    first = loaded[0]
    for path, p in zip(runs[1:], loaded[1:]):
        same = (worlds(p) == worlds(first) and set(p.collectives) == set(first.collectives)
                and bool(p.fsdp) == bool(first.fsdp)
                and p.env.get("host") == first.env.get("host") and p.env.get("cpu_count") == first.env.get("cpu_count"))
        if not same or p.inter or first.inter:
            raise UserError(f"--pool {path}: not a run of the same measurement as {runs[0]} (one machine "
                            "without torchrun, the same world sizes, collectives, --fsdp and host)")
    times: dict[tuple, list[dict]] = {}
    for p in loaded:
        for r in p.measurements:
            key = (r["gpus"], r.get("level", "intra"), r.get("collective", "all_reduce"), r["message_bytes"])
            times.setdefault(key, []).append(r)
    rows = [{**got[0], "time_us": statistics.median(r["time_us"] for r in got),
             "iters": sum(r.get("iters", 0) for r in got), "runs": len(got)}
            for key, got in sorted(times.items()) if len(got) == len(loaded)]
    figures = ("compute_slowdown", "copy_GBps")  # one run's rounds, where it has them, stay in its own file
    sharing = {w: {k: statistics.median(p.node_sharing[w][k] for p in loaded) for k in figures}
               for w in first.node_sharing if all(w in p.node_sharing for p in loaded)}
    cfg = dataclasses.replace(cfg, procs=tuple(sorted(worlds(first))),
                              collectives=tuple(sorted({r["collective"] for r in rows})))
    stacks = {}
    for w in first.fsdp:
        fresh = [p.fsdp[w]["fresh"] for p in loaded if p.fsdp[w].get("fresh")]
        pooled_fresh = None
        if len(fresh) == len(loaded) and all(f.get("threshold_bytes") is not None for f in fresh):
            pooled_fresh = {"threshold_bytes": int(statistics.median(f["threshold_bytes"] for f in fresh)),
                            "ms_per_MiB": statistics.median(f["ms_per_MiB"] for f in fresh),
                            "rows": [r for f in fresh for r in f.get("rows", [])]}
        stacks[w] = {"stacks": [s for p in loaded for s in p.fsdp[w].get("raw", [])], "fresh": pooled_fresh}
    env = {**first.env, "pooled_from": [{"file": str(path), "date": p.env.get("date")} for path, p in zip(runs, loaded)]}
    profile = _local_profile(cfg, rows, env, sharing, stacks)
    interconnect.write(profile, cfg.out)
    return profile


def format_profile(profile) -> str:
    from gnn_ptp import comm

    lines = [f"interconnect {profile.name}: {profile.description}",
             f"  {profile.gpus_per_node} ranks per node; all-reduce overlaps the backward: "
             f"{'yes' if profile.overlap else 'no'}"
             + (f"; compute slots per node: {profile.compute_slots}" if profile.compute_slots else "")]
    for ranks, sh in sorted(profile.node_sharing.items(), key=lambda kv: int(kv[0])):
        spread = sh.get("compute_slowdown_rounds")
        spread = (f", the median of {len(spread)} rounds, {min(spread):.2f}-{max(spread):.2f}x" if spread else "")
        lines.append(f"  {ranks} ranks on one node: compute {sh['compute_slowdown']:.2f}x slower than one rank "
                     f"alone (measured{spread}), memory copies at {sh['copy_GBps']:.1f} GB/s a rank")
    for level, fits in (("intra-node", profile.intra), ("inter-node", profile.inter)):
        for f in fits:
            rows = [r for r in profile.measurements if r["gpus"] == f.measured_gpus
                    and r.get("collective", "all_reduce") == "all_reduce"]
            lines.append(f"  {level} fit at {f.measured_gpus} ranks:")
            lines += ["    " + line for line in comm.describe_fabric(f, rows)]
    for ranks, ov in sorted(profile.fsdp.items(), key=lambda kv: int(kv[0])):
        fresh = ov.get("fresh") or {}
        lines.append(f"  FSDP2 host overheads at {ranks} ranks (synthetic stacks): {ov['unit_forward_ms']:.2f} ms "
                     f"forward and {ov['unit_backward_ms']:.2f} ms backward per unit, "
                     f"{ov['optimizer_tensor_ms'] * 1e3:.0f} us optimizer per parameter tensor"
                     + (f"; fresh buffers above {fresh['threshold_bytes'] / 2 ** 20:.1f} MiB cost "
                        f"{fresh['ms_per_MiB']:.3f} ms per MiB" if fresh.get("threshold_bytes") is not None else ""))
    for kind, levels in sorted(profile.collectives.items()):
        for level, fits in sorted(levels.items()):
            for f in fits:
                rows = [r for r in profile.measurements if r["gpus"] == f.measured_gpus
                        and r.get("collective") == kind and r.get("level", "intra") == level]
                lines.append(f"  {kind} ({level}-node) fit at {f.measured_gpus} ranks "
                             "(times of the unsharded tensor's size):")
                lines += ["    " + line for line in comm.describe_fabric(f, rows)]
    return "\n".join(lines)


def config_from_args(args) -> CalibrateConfig:
    fields = {f.name for f in dataclasses.fields(CalibrateConfig)}
    return CalibrateConfig(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
