"""Measured records -> graph samples for training and evaluation, with a processed-graph cache.

Each measured configuration (its records averaged when it was measured more than once) becomes one
``torch_geometric.data.Data``: the traced step's graph plus the labels
``y`` [1, 4] = log ms of forward, backward, optimizer and whole step, and ``mem`` [1] = log peak bytes.
Graphs are cached per dataset folder in ``.cache/`` (plain tensors, loaded with ``weights_only=True``);
the cache file's name holds the target's feature version (``graph.feature_version``) and the
torch/transformers versions (and, for CUDA targets, ``cuda_dispatch.DISPATCH_VERSION``), so a change in any
of them rebuilds it. Only configurations the
cache lacks are traced.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from gnn_ptp import graph as graph_mod
from gnn_ptp.errors import UserError
from gnn_ptp.records import iter_records, measurement_problem
from gnn_ptp.store import atomic_torch_save, from_bytes, to_bytes

PHASE_KEYS = ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")
_DATA_FIELDS = ("x", "x_cat", "edge_index", "edge_attr", "u", "phase", "grad_bytes", "fresh_bytes", "gemm_layout")
_FAILED = "__failed__"  # cache entry: {config key: why it would not trace}
LABEL_STATS = ("mean", "fastest")
"""How a configuration measured more than once gets its labels: ``mean``, the mean of its records' phase
medians (the default), or ``fastest``, the phase medians of its fastest record (smallest step median): the
uncontended machine's step, for hosts whose interference only ever slows a step down (README *Protocol*,
labels from the fastest record). Peak memory is the records' mean either way."""


def label_note(label: str) -> str:
    """What an error figure fitted to ``label`` adds about its steps: nothing for the mean (every label before
    the thirty-eighth session), else that each step is its configuration's ``label`` record, the uncontended
    step. One wording for a checkpoint's and a prior section's expected error."""
    return "" if label == "mean" else f"each step labelled by its configuration's {label} record (the uncontended step)"


@dataclass
class Measured:
    """One configuration and its labels (medians averaged over repeated measurements, or its fastest
    record's: ``LABEL_STATS``)."""

    key: str
    config: dict
    family: str
    hardware: str
    ms: dict[str, float]
    peak_bytes: float | None
    n_records: int
    torch_version: str | None = None
    """The torch that measured it: its graph is traced with that version's GPU kernel choices."""
    params: int | None = None
    """Parameters of the model that was measured (a check that the installed libraries build the same)."""
    transformers_version: str | None = None
    env: dict | None = None
    """The first record's environment (hardware, CPU model or GPU name: its hardware descriptor)."""


def measured_configs(data_dir: str | Path, world_size: int = 1, strict: bool = False,
                     label: str = "mean") -> list[Measured]:
    """The ok, single-process (or ``world_size``) configurations of a dataset folder, labelled by ``label``
    (``LABEL_STATS``). Bad record lines are skipped and reported (``strict``: refused), see
    ``records.iter_records``."""
    if label not in LABEL_STATS:
        raise UserError(f"labels {label!r}: allowed: {', '.join(LABEL_STATS)}")
    groups: dict[str, list[dict]] = defaultdict(list)
    skipped: list[str] = []
    for r in iter_records(data_dir, warn=skipped.append, strict=strict, check=measurement_problem):
        if r.get("status") != "ok" or (r.get("ddp") or {}).get("world_size", 1) != world_size:
            continue
        groups[r["key"]].append(r)
    out = []
    for key, rs in sorted(groups.items()):
        if label == "fastest":  # one record's phases: they add up to its step
            fastest = min(rs, key=lambda r: r["timing"]["step_ms"]["median"])
            ms = {k: fastest["timing"][k]["median"] for k in PHASE_KEYS}
        else:
            ms = {k: sum(r["timing"][k]["median"] for r in rs) / len(rs) for k in PHASE_KEYS}
        peaks = [r["memory"]["peak_bytes"] for r in rs if (r.get("memory") or {}).get("peak_bytes")]
        env = rs[0]["env"]
        out.append(Measured(key, rs[0]["config"], rs[0].get("family") or "?", env["hardware"], ms,
                            sum(peaks) / len(peaks) if peaks else None, len(rs), env.get("torch"),
                            rs[0].get("params"), env.get("transformers"), env))
    if not out:
        raise UserError(f"no usable records (status ok, world size {world_size}) in {data_dir}"
                        + (f"; {skipped[0]}" if skipped else ""))
    for message in skipped:
        print(f"warning: {message}", file=sys.stderr)
    hardware = {m.hardware for m in out}
    if len(hardware) > 1:
        raise UserError(f"{data_dir} mixes hardware {sorted(hardware)}; keep one folder per hardware")
    return out


def trace_target(hardware: str) -> str:
    return "cpu" if hardware == "cpu" else "cuda"


def step_config_of(config: dict, target: str, precision_aware: bool = True, kernels: str | None = None):
    from gnn_ptp.spec import ModelSpec, Shape
    from gnn_ptp.trace import StepConfig

    precision = config["precision"] if precision_aware else "fp32"
    return StepConfig(ModelSpec.from_dict(config),
                      Shape(config["batch_size"], config.get("seq_len"), config.get("image_size")),
                      precision, config.get("optimizer", "adamw"), target, kernels if target == "cuda" else None)


def measured_graph(config: dict, target: str, precision_aware: bool = True, kernels: str | None = None,
                   params: int | None = None, kernel_nodes: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """The graph (tensors, summary info) of a measured configuration, traced with the kernel choices of the
    torch that measured it (``kernels``). ``params``, the measured model's parameter count, must match
    what the installed libraries build: a model whose structure changed with a transformers release is
    refused, not guessed. ``kernel_nodes``: the info also holds the trace's kernel nodes (``node_labels``)."""
    from gnn_ptp.prediction import _build_graph

    tensors, info = _build_graph(step_config_of(config, target, precision_aware, kernels), kernel_nodes)
    if params is not None and info["param_count"] != params:
        raise TraceError(f"the installed libraries build {info['param_count']} parameters where the measured "
                         f"model had {params}: its module structure changed since it was measured")
    return tensors, info


def graph_tensors(config: dict, target: str, precision_aware: bool = True, kernels: str | None = None,
                  params: int | None = None) -> dict[str, torch.Tensor]:
    return measured_graph(config, target, precision_aware, kernels, params)[0]


class TraceError(RuntimeError):
    """A measured configuration whose graph cannot be rebuilt faithfully."""


def cache_key(m: Measured) -> str:
    """A measured configuration's graph-cache entry: its key, and the torch version whose kernel choices
    its graph follows (when that is not the installed one)."""
    if m.torch_version is None or m.hardware == "cpu":
        return m.key
    return f"{m.key}@torch{'.'.join(m.torch_version.split('+')[0].split('.')[:2])}"


def version_notes(measured: list[Measured]) -> list[str]:
    """What a user should know when the records were made with other library versions than installed."""
    import transformers

    notes = []
    torches = sorted({m.torch_version for m in measured if m.torch_version and m.hardware != "cpu"})
    if torches and any(v.split("+")[0] != torch.__version__.split("+")[0] for v in torches):
        notes.append(f"records measured with torch {', '.join(torches)}; installed {torch.__version__}: graphs "
                     "follow each record's own torch's kernel choices")
    tfs = sorted({m.transformers_version for m in measured if m.transformers_version})
    if tfs and any(v != transformers.__version__ for v in tfs):
        notes.append(f"records measured with transformers {', '.join(tfs)}; installed {transformers.__version__}: "
                     "its models may build a different module structure; each graph's parameter count is "
                     "checked against its record's and a mismatch leaves the record out, said so")
    return notes


def _cache_path(data_dir: Path, target: str, precision_aware: bool) -> Path:
    import transformers

    versions = (f"f{graph_mod.feature_version(target)}-l{graph_mod.LAYOUT_VERSION}"
                f"-torch{torch.__version__.split('+')[0]}-tf{transformers.__version__}")
    if target == "cuda":  # CUDA graphs also follow the kernel choices of cuda_dispatch
        from gnn_ptp.cuda_dispatch import DISPATCH_VERSION

        versions += f"-d{DISPATCH_VERSION}"
    return data_dir / ".cache" / f"graphs-{target}-{'aware' if precision_aware else 'unaware'}-{versions}.pt"


def load_graphs(data_dir: str | Path, measured: list[Measured], precision_aware: bool = True,
                log=None) -> dict[str, dict[str, torch.Tensor]]:
    """Graph tensors for every measured configuration: from the folder's cache, else from the per-graph
    cache ``predict`` keeps (``~/.cache/gnn-ptp/graphs``, keyed by step config, feature version and
    library versions), else traced now (each distinct step once: a precision-unaware graph is the fp32
    graph of the same config) and written to both. Progress goes to ``log`` (stderr)."""
    from gnn_ptp import node_labels
    from gnn_ptp.prediction import _cache_dir, _graph_key

    data_dir = Path(data_dir)
    target = trace_target(measured[0].hardware)
    path = _cache_path(data_dir, target, precision_aware)
    stored: dict = _load_folder_cache(path)
    failures: dict[str, str] = stored.pop(_FAILED, {})  # configs that would not trace: not retried
    cache = {k: v for k, v in stored.items() if all(f in v for f in _DATA_FIELDS)}  # stale entries go
    log = log or (lambda msg: print(msg, file=sys.stderr))
    for note in version_notes(measured):
        log(note)
    known_failures = [m for m in measured if cache_key(m) in failures]
    if known_failures:
        log(f"{len(known_failures)} configurations could not be traced before and are left out "
            f"(e.g. {known_failures[0].config['spec']}: {failures[cache_key(known_failures[0])]})"[:300])
    missing = [m for m in measured if cache_key(m) not in cache and cache_key(m) not in failures]
    # the shared per-graph cache, and one trace per distinct step
    by_graph: dict[str, list[Measured]] = {}
    for m in missing:
        by_graph.setdefault(_graph_key(step_config_of(m.config, target, precision_aware, m.torch_version)),
                            []).append(m)
    shared = _cache_dir()
    reused = 0
    for gkey in list(by_graph):
        tensors = _load_shared(shared / f"{gkey}.pt", by_graph[gkey][0].params)
        if tensors is not None:
            for m in by_graph.pop(gkey):
                cache[cache_key(m)] = tensors
                reused += 1
    if missing:
        log(f"{len(missing)} graphs for {data_dir} not in its cache: {reused} from {shared}, "
            f"{len(by_graph)} distinct steps to trace ({len(cache) - reused} cached) ...")
    start, failed, shown_s = time.perf_counter(), 0, 0.0
    # steps that share one trace (tf32 and torch-default are converted from the fp32 trace) go to one worker
    # in a row, so that each trace is recorded once
    by_trace = trace_groups(list(by_graph), lambda k: step_config_of(
        by_graph[k][0].config, target, precision_aware, by_graph[k][0].torch_version))
    keys = [k for ks in by_trace for k in ks]
    # configurations with per-op profiles need the same trace's kernel nodes for their node labels: kept
    # from this trace (node_labels.remember_nodes) rather than traced a second time by node_labels.load
    profiled = set(node_labels.profiled_ids(data_dir)) if precision_aware and keys else set()
    kernel_nodes: dict[str, list] = {}
    job = lambda k: (by_graph[k][0].config, target, precision_aware, by_graph[k][0].torch_version,  # noqa: E731
                     by_graph[k][0].params, any(m.key in profiled for m in by_graph[k]))
    results = _map_in_groups(_graph_or_error, [[job(k) for k in ks] for ks in by_trace])
    for i, (gkey, result) in enumerate(zip(keys, results), 1):
        group = by_graph[gkey]
        if isinstance(result, str):  # a config that measured fine but will not trace: skip, say so
            failed += len(group)
            for m in group:
                failures[cache_key(m)] = result[:500]
            log(f"  skipped {group[0].config['spec']} ({group[0].config['precision']}): {result}"[:300])
        else:
            tensors, info = from_bytes(result)
            nodes = info.pop("kernel_nodes", None)
            for m in group:
                cache[cache_key(m)] = tensors
                if nodes is not None and m.key in profiled:
                    kernel_nodes[m.key] = nodes
            try:  # predict (and a later evaluate of another folder) reuse it
                atomic_torch_save({"tensors": tensors, "info": json.dumps(info)}, shared / f"{gkey}.pt")
            except OSError:
                pass
        if i % 50 == 0 or i == len(keys):
            atomic_torch_save({**cache, _FAILED: failures}, path)
        elapsed = time.perf_counter() - start
        if i == len(keys) or i % max(1, min(50, len(keys) // 10)) == 0 or elapsed - shown_s >= 30:
            shown_s = elapsed
            left = elapsed / i * (len(keys) - i)
            log(f"  {i}/{len(keys)} traced ({elapsed:.0f} s" + (f", ~{left:.0f} s left)" if i < len(keys) else ")"))
    if (reused or known_failures) and not keys:
        atomic_torch_save({**cache, _FAILED: failures}, path)
    if kernel_nodes:
        node_labels.remember_nodes(data_dir, [m for m in measured if m.key in kernel_nodes], kernel_nodes)
    if failed:
        log(f"{failed} configurations could not be traced and are left out")
    return {m.key: cache[cache_key(m)] for m in measured if cache_key(m) in cache}


def _load_folder_cache(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # a damaged cache (a killed run mid-write cannot leave one; a copied one can)
        return {}


def _load_shared(path: Path, params: int | None = None) -> dict | None:
    """A graph from predict's shared cache; None where it is missing, unreadable, or (``params`` given)
    of a model with another parameter count than the measured one: then it is traced and checked."""
    if not path.is_file():
        return None
    try:
        entry = torch.load(path, weights_only=True)
        tensors = entry["tensors"]
        if params is not None and json.loads(entry["info"]).get("param_count") != params:
            return None
    except Exception:  # an unreadable entry is rebuilt, never trusted
        return None
    return tensors if all(f in tensors for f in _DATA_FIELDS) else None


def _graph_or_error(job) -> bytes | str:
    """(graph tensors, summary info) serialised to bytes (torch's own tensor sharing between processes
    passes file descriptors that die with the worker), or why the config would not trace."""
    try:
        return to_bytes(measured_graph(*job))
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def _map_in_groups(fn, groups: list[list]):
    """``_map`` of ``fn`` over every job of ``groups``, each group run in one worker in a row (jobs whose
    graphs come from one trace, ``trace.shared_trace``: each process records a trace once); the results in
    order, one per job."""
    for group, results in zip(groups, _map(functools.partial(_each, fn), groups)):
        yield from (results if isinstance(results, list) else [results] * len(group))


def _each(fn, group: list) -> list | str:
    """``fn`` of each job of a group, in one process; a forked worker that may not run autograd
    (``prediction._fork_refused``) answers that alone, for ``_map`` to run the group here."""
    from gnn_ptp.prediction import _fork_refused

    out = []
    for job in group:
        result = fn(job)
        if isinstance(result, str) and _fork_refused(RuntimeError(result)):
            return result
        out.append(result)
    return out


def trace_groups(items: list, step_config) -> list[list]:
    """``items`` grouped by the trace their graphs come from (``trace.shared_trace`` of
    ``step_config(item)``), in order of first appearance: fp32, tf32 and torch-default steps of one model
    and shape share one."""
    from gnn_ptp.trace import shared_trace

    groups: dict = {}
    for item in items:
        groups.setdefault(shared_trace(step_config(item)), []).append(item)
    return list(groups.values())


def _map(fn, jobs: list):
    """``map`` over forked workers, one per core (results in order, as they come)."""
    import os

    workers = min(len(jobs), os.cpu_count() or 1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    if workers <= 1 or sys.platform != "linux":
        yield from map(fn, jobs)
        return
    import multiprocessing

    from gnn_ptp.prediction import _fork_refused, _single_threaded

    done = 0
    with multiprocessing.get_context("fork").Pool(workers, maxtasksperchild=50,
                                                  initializer=_single_threaded) as pool:
        for result in pool.imap(fn, jobs, chunksize=1):
            if isinstance(result, str) and _fork_refused(RuntimeError(result)):
                if done == 0:
                    break  # this process ran autograd before: forked children cannot; trace here
                # a worker forked later (the pool replaces them) after this process ran autograd:
                # this one job is run here rather than reported as a failure (and cached as one)
                result = fn(jobs[done])
            done += 1
            yield result
    yield from map(fn, jobs[done:])


def make_samples(measured: list[Measured], graphs: dict[str, dict]) -> list:
    """PyG ``Data`` samples with labels; configurations without a graph are left out."""
    from torch_geometric.data import Data

    samples = []
    for m in measured:
        g = graphs.get(m.key)
        if g is None:
            continue
        d = Data(**g)
        d.num_nodes = g["x"].shape[0]
        d.y = torch.tensor([[math.log(max(m.ms[k], 1e-6)) for k in PHASE_KEYS]], dtype=torch.float32)
        d.mem = torch.tensor([math.log(m.peak_bytes) if m.peak_bytes else float("nan")], dtype=torch.float32)
        d.key, d.family, d.precision = m.key, m.family, m.config["precision"]
        samples.append(d)
    return samples


def data_hash(measured: list[Measured]) -> str:
    h = hashlib.sha256()
    for m in sorted(measured, key=lambda m: m.key):
        h.update(json.dumps([m.key, m.ms, m.peak_bytes], sort_keys=True).encode())
    return h.hexdigest()[:16]


def family_split(families: list[str], seed: int, test_families=None, val_families=None,
                 test_fraction: float = 0.2, val_fraction: float = 0.15) -> dict[str, str]:
    """Assign whole families to train / val / test, reproducibly from the seed (or as named)."""
    families = sorted(set(families))
    for name, chosen in (("test", test_families), ("val", val_families)):
        unknown = sorted(set(chosen or ()) - set(families))
        if unknown:
            raise UserError(f"{name} families {unknown} are not in the data; families: {', '.join(families)}")
    rest = [f for f in families if f not in set(test_families or ()) | set(val_families or ())]
    random.Random(seed).shuffle(rest)
    if test_families is None:  # test_fraction 0: nothing held out for testing (validation still is)
        n = max(1, round(test_fraction * len(families))) if test_fraction > 0 else 0
        test_families, rest = rest[:n], rest[n:]
    if val_families is None:
        n = max(1, round(val_fraction * len(families)))
        val_families, rest = rest[:n], rest[n:]
    if not rest:
        raise UserError(f"no family left to train on after holding out test {test_families} and "
                        f"val {val_families}")
    split = {f: "train" for f in rest}
    split.update({f: "val" for f in val_families})
    split.update({f: "test" for f in test_families})
    return split
