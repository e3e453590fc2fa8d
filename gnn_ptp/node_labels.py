"""Kernel-level labels: every graph node's measured time, from the per-op profiles stored beside records.

A configuration whose records carry profiles (``profiles.py``; the harvest writes them) has each profile
matched onto its traced graph (``match.py``). A matched node's **share** of its phase is its op's
inclusive time over all profiled op time of that phase (``Match.total_ms``); shares are averaged over the
configuration's profiles (over the profiles that matched the node). The node's label is that share of the
configuration's measured phase time (the averaged medians the phase labels hold), in log ms:

    y_node = log(share) + y[phase of the node]

so node labels sit on the phase labels' scale (a profiled step runs slower than a timed one: the profiler's
own overhead) and matched nodes add up to the matched share of each phase. On a ``Data`` sample:
``node_share`` [N] (float), ``y_node`` [N] (log ms), ``node_mask`` [N] (bool: matched in at least one
profile) and ``matched_share`` [1] (the configuration's time-weighted matched share; NaN without a
profile). A configuration without a profile has an all-false mask.

Matching needs the traced step's kernels (op names and input shapes: ``match.kernel_nodes``), not the
cached graph tensors. ``<data>/.cache/node-labels-<versions>.pt`` keeps them per configuration and each
profile's match by record id, so a configuration is traced once and a new profile costs its match only;
a new ``match.MATCH_VERSION`` re-matches the profiles and keeps the traced kernels.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from gnn_ptp import ops

def profile_shares(nodes: list, profile: dict) -> dict:
    """One profile matched onto a configuration's ``match.kernel_nodes``: each node's share of its phase
    (0 where unmatched), which nodes matched, and the matched and total profiled ms."""
    from gnn_ptp import match
    from gnn_ptp.trace import PHASES

    m = match.match_profile(None, profile, nodes)
    node_phase = torch.tensor([ph for _, ph, _ in nodes], dtype=torch.long)
    node_ms = torch.tensor(m.node_ms, dtype=torch.float64)
    phase_total = torch.tensor([m.total_ms[ph] for ph in PHASES], dtype=torch.float64)
    ok = ~torch.isnan(node_ms) & (phase_total[node_phase] > 0)
    share = torch.where(ok, node_ms / phase_total[node_phase].clamp_min(1e-12), torch.zeros_like(node_ms))
    return {"share": share.float(), "ok": ok, "matched_ms": sum(m.matched_ms.values()),
            "total_ms": sum(m.total_ms.values())}


def combine(entries: list[dict]) -> dict:
    """A configuration's labels from its profiles' ``profile_shares``: each node's share averaged over
    the profiles that matched it, the mask (matched in at least one), matched and total ms summed."""
    total = torch.stack([e["share"].double() for e in entries]).sum(0)
    count = torch.stack([e["ok"].double() for e in entries]).sum(0)
    mask = count > 0
    return {"share": torch.where(mask, total / count.clamp_min(1), torch.zeros_like(total)), "mask": mask,
            "matched_ms": sum(e["matched_ms"] for e in entries), "total_ms": sum(e["total_ms"] for e in entries)}


def shares_of(traced, profiles: list[dict]) -> dict:
    """``combine`` over the profiles of one traced configuration."""
    from gnn_ptp import match

    nodes = match.kernel_nodes(traced)
    return combine([profile_shares(nodes, p) for p in profiles])


def _nodes_job(job) -> list | str:
    """For a worker: (config, trace target, torch version) -> the traced graph's ``match.kernel_nodes``,
    or why the configuration could not be traced."""
    from gnn_ptp import dataset, match
    from gnn_ptp.trace import trace_step

    config, target, kernels = job
    try:
        return match.kernel_nodes(trace_step(dataset.step_config_of(config, target, kernels=kernels)))
    except Exception as e:  # a configuration that will not trace: no node labels, said so
        return f"{type(e).__name__}: {e}"[:300]


def profiled_ids(data_dir, world_size: int = 1) -> dict[str, list[str]]:
    """Record ids with a stored profile, per configuration key (ok records of ``world_size`` only)."""
    from gnn_ptp.records import iter_records

    out: dict[str, list[str]] = defaultdict(list)
    present: dict[str, bool] = {}
    for r in iter_records(data_dir, warn=lambda m: None):
        if (r.get("status") == "ok" and r.get("profile") and r.get("id")
                and (r.get("ddp") or {}).get("world_size", 1) == world_size):
            file = str((r["profile"] or {}).get("file") or "")
            if file not in present:  # profiles kept out of the tree (e.g. only in git history) do not count
                present[file] = bool(file) and (Path(data_dir) / file).is_file()
            if present[file]:
                out[r["key"]].append(r["id"])
    return {k: sorted(v) for k, v in out.items()}


def _cache_path(data_dir: Path, cuda: bool = False) -> Path:
    """The folder's node-label cache; for a folder of CUDA records (``cuda``) its name also holds
    ``cuda_dispatch.DISPATCH_VERSION``, whose kernel choices its traced nodes follow."""
    import transformers

    from gnn_ptp.graph import feature_version

    versions = (f"f{feature_version('cuda' if cuda else 'cpu')}-torch{torch.__version__.split('+')[0]}"
                f"-tf{transformers.__version__}")
    if cuda:
        from gnn_ptp.cuda_dispatch import DISPATCH_VERSION

        versions += f"-d{DISPATCH_VERSION}"
    return Path(data_dir) / ".cache" / f"node-labels-{versions}.pt"


def _cache_of(data_dir, measured: list) -> Path:
    """The node-label cache of these configurations (CUDA-target ones carry the dispatch version)."""
    from gnn_ptp import dataset

    return _cache_path(Path(data_dir), cuda=any(dataset.trace_target(m.hardware) == "cuda" for m in measured))


def _read_cache(path: Path) -> dict:
    """The cache, with its profile matches dropped when another ``match.MATCH_VERSION`` made them (the
    traced kernel nodes do not depend on the matching and are kept)."""
    from gnn_ptp.match import MATCH_VERSION

    try:
        cache = torch.load(path, weights_only=True) if path.is_file() else {}
    except Exception:  # a damaged cache is rebuilt, never trusted
        return {}
    if cache and cache.get("match_version") != MATCH_VERSION:
        cache["profiles"] = {}
    return cache


def _write_cache(path: Path, nodes: dict, matched: dict, failed: dict, absent) -> None:
    """The folder's node-label cache: traced kernel nodes and failures by configuration key, profile
    matches by record id, and the ids whose profile file turned out not to hold them."""
    from gnn_ptp.match import MATCH_VERSION
    from gnn_ptp.store import atomic_torch_save

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save({"nodes": nodes, "profiles": matched, "failed": failed, "absent": sorted(absent),
                       "match_version": MATCH_VERSION}, path)


def remember_nodes(data_dir, measured: list, nodes: dict[str, list]) -> None:
    """Keep kernel nodes traced elsewhere in the folder's cache, by configuration key: ``dataset.load_graphs``
    traces the very step ``load`` would (same config, same kernel choices) and hands them over, so that
    ``load`` only matches the profiles."""
    path = _cache_of(data_dir, measured)
    cache = _read_cache(path)
    known = cache.get("nodes", {})
    new = {k: v for k, v in nodes.items() if k not in known}
    if new:
        _write_cache(path, {**known, **new}, cache.get("profiles", {}), cache.get("failed", {}),
                     cache.get("absent", []))


def load(data_dir, measured: list, log=None) -> dict[str, dict]:
    """Labels (``combine``) for every measured configuration with profiled records. The folder's cache
    keeps each configuration's traced kernel nodes and each profile's match, so a new profile costs its
    match only; what is missing is traced (one configuration per core) and matched now."""
    from gnn_ptp import dataset, profiles

    log = log or (lambda msg: print(msg, file=sys.stderr))
    ids = profiled_ids(data_dir)
    wanted = [m for m in measured if m.key in ids]
    path = _cache_of(data_dir, wanted)
    cache = _read_cache(path)
    nodes, matched, failed = cache.get("nodes", {}), cache.get("profiles", {}), cache.get("failed", {})
    absent = set(cache.get("absent", []))  # ids whose profile their file turned out not to hold
    to_trace = [m for m in wanted if m.key not in nodes and m.key not in failed]
    to_match = [i for m in wanted if m.key not in failed for i in ids[m.key] if i not in matched and i not in absent]
    if to_trace or to_match:
        start = time.perf_counter()
        log(f"node labels: tracing {len(to_trace)} configurations, matching {len(to_match)} profiles ...")
        # fp32, tf32 and torch-default steps of one model and shape share one trace: one worker, in a row
        groups = dataset.trace_groups(to_trace, lambda m: dataset.step_config_of(
            m.config, dataset.trace_target(m.hardware), kernels=m.torch_version))
        to_trace = [m for group in groups for m in group]
        jobs = [[(m.config, dataset.trace_target(m.hardware), m.torch_version) for m in group] for group in groups]
        for i, (m, result) in enumerate(zip(to_trace, dataset._map_in_groups(_nodes_job, jobs)), 1):
            if isinstance(result, str):
                failed[m.key] = result
                log(f"  no node labels for {m.config['spec']} ({m.config['precision']}): {result}")
            else:
                nodes[m.key] = result
            if i % 50 == 0 or i == len(to_trace):
                _write_cache(path, nodes, matched, failed, absent)
                log(f"  {i}/{len(to_trace)} traced ({time.perf_counter() - start:.0f} s)")
        found = profiles.read_profiles(data_dir) if to_match else {}
        absent |= {i for i in to_match if i not in found}
        for m in wanted:
            for i in ids[m.key]:
                if i not in matched and i in found and m.key in nodes:
                    matched[i] = profile_shares(nodes[m.key], found[i])
        _write_cache(path, nodes, matched, failed, absent)
        log(f"node labels ready ({time.perf_counter() - start:.0f} s)")
    return {m.key: combine([matched[i] for i in ids[m.key] if i in matched])
            for m in wanted if any(i in matched for i in ids[m.key])}


def node_seconds(data_dir, measured: list, log=None, profiler_cost: bool = False) -> dict[str, list[torch.Tensor]]:
    """Per configuration key, one tensor per profile of every node's measured device (GPU) or host (CPU)
    seconds, NaN where the profile matched no op to the node: the raw material of kernel-level fits
    (``prior_fit``). Uses (and fills) the folder's node-label cache for the traced kernels. With
    ``profiler_cost`` a CPU node's seconds leave out what the profiler adds to each op it took (the
    folder's ``profiler_cost_us``: one cost per phase for every profile)."""
    from gnn_ptp import match, profiles

    load(data_dir, measured, log)
    ids = profiled_ids(data_dir)
    cache = torch.load(_cache_of(data_dir, [m for m in measured if m.key in ids]), weights_only=True)
    found = profiles.read_profiles(data_dir)
    cost = profiler_cost_us(data_dir, found) if profiler_cost else None
    out: dict[str, list[torch.Tensor]] = {}
    for m in measured:
        nodes = cache["nodes"].get(m.key)
        if nodes is None:
            continue
        for i in ids.get(m.key, ()):
            if i in found:
                ms = match.match_profile(None, found[i], nodes, cost).node_ms
                out.setdefault(m.key, []).append(torch.tensor(ms, dtype=torch.float64) / 1e3)
    return out


def profiled_records(data_dir, found: dict | None = None):
    """(record, its profile) for every ok single-process record of the folder whose profile is stored.
    ``found``: ``profiles.read_profiles`` of the folder (read here when not given)."""
    from gnn_ptp import profiles
    from gnn_ptp.records import iter_records, measurement_problem

    found = profiles.read_profiles(data_dir) if found is None else found
    for r in iter_records(data_dir, warn=lambda _: None, strict=False, check=measurement_problem):
        if r.get("status") == "ok" and r.get("id") in found and (r.get("ddp") or {}).get("world_size", 1) == 1:
            yield r, found[r["id"]]


def profiler_cost_us(data_dir, found: dict | None = None) -> tuple[float, float, float] | None:
    """Per phase, the microseconds the profiler adds to each op it records on the folder's CPU: the median
    over its profiled single-process records of ``profiles.profiler_cost_us`` (each one profiled step
    against its record's unprofiled medians: one step is noisy, the median of hundreds is not). None
    where no record has a CPU profile with phase times. ``found``: ``profiles.read_profiles`` of the folder."""
    from gnn_ptp import profiles

    costs = [profiles.profiler_cost_us(p, r.get("timing")) for r, p in profiled_records(data_dir, found)]
    costs = [c for c in costs if c is not None]
    return tuple(float(v) for v in np.median(np.array(costs), 0)) if costs else None


def attach(samples: list, labels: dict[str, dict]) -> int:
    """Give every sample ``node_share``, ``y_node``, ``node_mask`` and ``matched_share`` (see the module
    docstring); a sample without labels, or whose graph does not have the labelled node count, gets an
    all-false mask. Returns how many samples got labels."""
    n_labelled = 0
    for s in samples:
        n = int(s.num_nodes)
        lab = labels.get(s.key)
        if lab is not None and lab["share"].numel() == n:
            share, mask = lab["share"].float(), lab["mask"].clone()
            mask &= share > 0
            matched = lab["matched_ms"] / lab["total_ms"] if lab["total_ms"] else float("nan")
            n_labelled += bool(mask.any())
        else:
            share, mask, matched = torch.zeros(n), torch.zeros(n, dtype=torch.bool), float("nan")
        s.node_share, s.node_mask = share, mask
        s.y_node = torch.where(mask, torch.log(share.clamp_min(1e-12)) + s.y[0, s.phase], torch.zeros(n))
        s.matched_share = torch.tensor([matched], dtype=torch.float32)
    return n_labelled


def node_loss(log_node_ms: torch.Tensor, batch, delta: float) -> torch.Tensor | None:
    """Huber loss on log time over the labelled nodes, each weighted by its measured share of its phase
    (a weighted mean: the ops that hold the time count, a thousand tiny ones do not drown them). None
    where the batch has no labelled node."""
    mask = getattr(batch, "node_mask", None)
    if mask is None or not bool(mask.any()):
        return None
    weight = batch.node_share[mask]
    err = torch.nn.functional.huber_loss(log_node_ms[mask], batch.y_node[mask], delta=delta, reduction="none")
    return (weight * err).sum() / weight.sum().clamp_min(1e-12)


# --- per-op figures ----------------------------------------------------------------------------------


@torch.no_grad()
def per_op_report(model, samples: list, top: int = 5, batch_size: int = 32) -> dict | None:
    """Predicted against measured time per op category, on the labelled nodes of ``samples``:

    - ``per_op``: {category: {"mape", "share_measured", "share_predicted", "n"}}: per step, a category's
      time summed over its labelled nodes, measured and predicted; MAPE over the steps where it has
      measured time (n); shares of the labelled time, averaged over all labelled steps;
    - ``matched_share``: the steps' matched shares (profiled time matched to graph nodes over all
      profiled time), averaged over the profiled steps;
    - ``share_error``: |predicted share - measured share| in points, per step averaged over its ``top`` ops
      (by name) by measured share; mean, median and per family over the labelled steps.

    None for a model without per-node times (``readout = "pool"``)."""
    from torch_geometric.loader import DataLoader

    model.eval()
    per_cat: dict[str, dict[str, list]] = defaultdict(lambda: {"ape": [], "meas": [], "pred": []})
    share_err, fam_err = [], defaultdict(list)
    labelled = 0
    matched = [float(s.matched_share) for s in samples if not math.isnan(float(s.matched_share))]
    for batch in DataLoader(samples, batch_size=batch_size, shuffle=False):
        out = model(batch)
        if "log_node_ms" not in out:
            return None
        pred_all = out["log_node_ms"].double().exp()
        for i in range(batch.num_graphs):
            lo, hi = int(batch.ptr[i]), int(batch.ptr[i + 1])
            mask = batch.node_mask[lo:hi]
            if not bool(mask.any()):
                continue
            labelled += 1
            meas = batch.y_node[lo:hi][mask].double().exp()
            pred = pred_all[lo:hi][mask]
            x_cat = batch.x_cat[lo:hi][mask]
            cats = defaultdict(lambda: [0.0, 0.0])
            names = defaultdict(lambda: [0.0, 0.0])
            for op_id, cat_id, m, p in zip(x_cat[:, 0].tolist(), x_cat[:, 1].tolist(), meas.tolist(), pred.tolist()):
                cats[ops.CATEGORIES[cat_id]][0] += m
                cats[ops.CATEGORIES[cat_id]][1] += p
                names[ops.VOCAB[op_id]][0] += m
                names[ops.VOCAB[op_id]][1] += p
            tm, tp = float(meas.sum()), float(pred.sum())
            for cat in ops.CATEGORIES:
                m, p = cats.get(cat, (0.0, 0.0))
                per_cat[cat]["meas"].append(m / tm)
                per_cat[cat]["pred"].append(p / tp)
                if m > 0:
                    per_cat[cat]["ape"].append(abs(p - m) / m * 100)
            tops = sorted(names.items(), key=lambda kv: -kv[1][0])[:top]
            err = sum(abs(p / tp - m / tm) for _, (m, p) in tops) / len(tops) * 100
            share_err.append(err)
            fam_err[batch.family[i]].append(err)
    if not labelled:
        return {"per_op": {}, "matched_share": None, "share_error": None, "labelled_steps": 0}
    per_op = {cat: {"mape": sum(v["ape"]) / len(v["ape"]), "share_measured": sum(v["meas"]) / labelled,
                    "share_predicted": sum(v["pred"]) / labelled, "n": len(v["ape"])}
              for cat, v in per_cat.items() if v["ape"]}
    ordered = sorted(share_err)
    return {"per_op": dict(sorted(per_op.items(), key=lambda kv: -kv[1]["share_measured"])),
            "matched_share": sum(matched) / len(matched) if matched else None,
            "share_error": {"top": top, "mean_points": sum(share_err) / len(share_err),
                            "median_points": ordered[len(ordered) // 2],
                            "per_family": {f: sum(v) / len(v) for f, v in sorted(fam_err.items())}},
            "labelled_steps": labelled}


def format_per_op(r: dict) -> list[str]:
    """Lines for ``evaluate``'s table."""
    if not r or not r.get("labelled_steps"):
        return ["per-op figures: none (no profiled configuration in this split, or a checkpoint without "
                "per-node times: readout pool)"]
    e = r["share_error"]
    lines = [f"per op (node labels of {r['labelled_steps']} profiled steps; matched share "
             f"{r['matched_share']:.1%}): top-{e['top']} op share error {e['mean_points']:.1f} points "
             f"(median {e['median_points']:.1f})",
             f"{'category':<14}{'measured':>10}{'predicted':>11}{'MAPE':>8}{'n':>6}"]
    for cat, v in r["per_op"].items():
        lines.append(f"{cat:<14}{v['share_measured']:>10.1%}{v['share_predicted']:>11.1%}{v['mape']:>7.1f}%"
                     f"{v['n']:>6}")
    return lines


def labelled_meta(meta: dict) -> str:
    """How a checkpoint's per-node times were trained, for ``predict --explain``."""
    weight = (meta.get("train") or {}).get("node_weight") or 0
    if weight:
        return f"trained with node labels from measured profiles (node_weight {weight:g})"
    return "trained on phase totals only: its split across ops is not supervised op by op"


def read_meta(checkpoint: str) -> dict:
    try:
        return json.loads((Path(checkpoint) / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
