"""``gnn-ptp data stats``: what a dataset folder holds and how noisy its measurements are."""

from __future__ import annotations

import statistics
import sys
from collections import Counter, defaultdict

from gnn_ptp.errors import UserError
from gnn_ptp.records import iter_records, record_problem


def noise(record: dict) -> float | None:
    """Run-to-run spread of one record's step time: (p90 - p10) / median."""
    step = (record.get("timing") or {}).get("step_ms")
    if not step or not step.get("median") or not all(isinstance(step.get(q), (int, float)) for q in ("p10", "p90")):
        return None
    return (step["p90"] - step["p10"]) / step["median"]


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


def dataset_stats(path, min_step_ms: float = 10.0, strict: bool = False) -> dict:
    skipped: list[str] = []
    rows = list(iter_records(path, warn=skipped.append, strict=strict, check=record_problem))
    if not rows:
        raise UserError(f"no records in {str(path)!r}: " + (skipped[0] if skipped else
                        "it holds no *.jsonl record (a dataset folder holds <grid>.jsonl files written by "
                        "gnn-ptp collect)"))
    for message in skipped:
        print(f"warning: {message}", file=sys.stderr)
    by = {name: Counter() for name in ("hardware", "family", "precision", "status", "world_size")}
    noises, long_noises = [], []
    groups: dict[str, list[float]] = defaultdict(list)
    by_kind: dict[tuple, list[float]] = defaultdict(list)  # (hardware, key): step medians, for the floor
    for r in rows:
        by["hardware"][(r.get("env") or {}).get("hardware", "?")] += 1
        by["family"][r.get("family") or "?"] += 1
        by["precision"][r["config"]["precision"]] += 1
        by["status"][r.get("status", "?")] += 1
        by["world_size"][(r.get("ddp") or {}).get("world_size", 1)] += 1
        n = noise(r) if r.get("status") == "ok" else None
        if n is not None:
            noises.append(n)
            if r["timing"]["step_ms"]["median"] >= min_step_ms:
                long_noises.append(n)
            groups[r["key"]].append(r["timing"]["step_ms"]["median"])
            if (r.get("ddp") or {}).get("world_size", 1) == 1:  # the floor of single-process labels, as train's
                by_kind[((r.get("env") or {}).get("hardware"), r["key"])].append(r["timing"]["step_ms"]["median"])

    def dist(values):
        if not values:
            return {"n": 0}
        return {"n": len(values), "median": statistics.median(values), "p90": _quantile(values, 0.9),
                "max": max(values), "share_le_2pct": sum(v <= 0.02 for v in values) / len(values)}

    repeats = [abs(v[1] - v[0]) / ((v[1] + v[0]) / 2) for v in groups.values() if len(v) >= 2]
    from gnn_ptp.noise import NoiseFloor

    floor = NoiseFloor(dict(by_kind)).floor(list(by_kind))
    return {
        "records": len(rows),
        "by_hardware": dict(by["hardware"]), "by_family": dict(sorted(by["family"].items())),
        "by_precision": dict(by["precision"]), "by_status": dict(by["status"]),
        "by_world_size": {str(k): v for k, v in sorted(by["world_size"].items())},
        "noise": dist(noises), f"noise_steps_ge_{min_step_ms:g}ms": dist(long_noises),
        "repeat_difference": dist(repeats),
        "label_noise_floor": floor,
        "host_probe": host_probe_stats(rows),
        "optimizer_zeros": optimizer_zero_stats(rows),
        "collection": collection_stats(rows),
    }


def host_probe_stats(rows: list[dict]) -> dict:
    """The host's issue cost around the timed steps (``host_probe.py``; records from 2026-11-25 on): its
    spread over the records, and how many saw it change by more than 1.5x during their own timed steps."""
    probes = [r["host_probe"] for r in rows if r.get("status") == "ok" and r.get("host_probe")]
    if not probes:
        return {"n": 0}
    before = [p["issue_us_before"] for p in probes]
    changed = sum(max(p["issue_us_before"], p["issue_us_after"]) > 1.5 * min(p["issue_us_before"], p["issue_us_after"])
                  for p in probes)
    out = {"n": len(probes), "median_us": statistics.median(before), "p10_us": _quantile(before, 0.1),
           "p90_us": _quantile(before, 0.9), "changed_during_record": changed}
    probed = [p for p in probes if p.get("fresh_ms_per_mib_before") is not None]
    fresh = [p["fresh_ms_per_mib_before"] for p in probed if p.get("fresh_faults_per_mib", 0) >= 1]
    if probed:  # a CPU's fresh-mapping cost (host_probe.fresh_fill; records from the fifty-third session on)
        out["fresh"] = {"n": len(fresh), "no_fault": len(probed) - len(fresh)}  # no fault: a reused buffer, no reading
        if fresh:
            out["fresh"].update(median_ms_per_mib=statistics.median(fresh), p10_ms_per_mib=_quantile(fresh, 0.1),
                                p90_ms_per_mib=_quantile(fresh, 0.9))
    return out


def optimizer_zero_stats(rows: list[dict]) -> dict:
    """The share of AdamW's second moments that were exactly zero when the timed steps ended
    (``optimizer_state.py``; records from the twenty-eighth session on, 2026-11-28): per family, the median and
    largest share. On a CPU each zero costs the optimizer's square root several ns (``benchmarks/zero_sqrt.py``)."""
    from gnn_ptp.optimizer_state import zero_fraction

    by: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        share = zero_fraction(r) if r.get("status") == "ok" else None
        if share is not None:
            by[r.get("family") or "?"].append(share)
    n = sum(len(v) for v in by.values())
    if not n:
        return {"n": 0}
    return {"n": n, "by_family": {f: {"median": statistics.median(v), "max": max(v), "n": len(v)}
                                   for f, v in sorted(by.items())}}


def collection_stats(rows: list[dict]) -> dict:
    """How the records were collected: per loop, records per minute of collector time (a harvest model's
    build counted once for the records that share it), the share of that time in timed steps and in
    profiling; flags; profiled records."""
    from gnn_ptp.harvest import group_key

    out: dict = {"flags": dict(Counter(f for r in rows for f in r.get("flags") or [])),
                 "profiled": sum(1 for r in rows if r.get("profile"))}
    by_mode: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("collector"):
            by_mode[r["collector"].get("mode", "classic")].append(r)
    for mode, mine in sorted(by_mode.items()):
        wall = sum(r["collector"].get("wall_s", 0.0) for r in mine)
        if mode == "harvest":
            builds = {(r.get("timestamp", "")[:13], group_key(r["config"])): r["collector"].get("build_s", 0.0)
                      for r in mine if "config" in r}
            wall += sum(builds.values())
        timed = sum(r["collector"].get("timed_s", 0.0) for r in mine)
        profiled = sum(r["collector"].get("profile_s", 0.0) for r in mine)
        out[mode] = {"records": len(mine), "wall_s": round(wall, 1),
                     "records_per_min": round(60 * len(mine) / wall, 1) if wall else None,
                     "timed_share": round(timed / wall, 3) if wall else 0.0,
                     "profile_share": round(profiled / wall, 3) if wall else 0.0}
    return out


def format_stats(s: dict) -> str:
    lines = [f"records: {s['records']}"]
    for key in ("by_hardware", "by_status", "by_precision", "by_world_size", "by_family"):
        items = ", ".join(f"{k} {v}" for k, v in s[key].items())
        lines.append(f"{key[3:]:<12} {items}")
    for key in [k for k in s if k.startswith("noise")] + ["repeat_difference"]:
        d = s[key]
        title = {"noise": "noise (p90-p10)/median, all ok records"}.get(key, key.replace("_", " "))
        if key == "repeat_difference":
            title = "re-measured configurations, |a-b|/mean of medians"
        elif key != "noise":
            title = f"noise, steps >= {key.split('_ge_')[1]}"
        if d["n"] == 0:
            lines.append(f"{title}: none")
        else:
            lines.append(f"{title}: n {d['n']}, median {d['median']:.2%}, p90 {d['p90']:.2%}, "
                         f"max {d['max']:.2%}, <= 2%: {d['share_le_2pct']:.0%}")
    if s.get("label_noise_floor") is not None:
        lines.append(f"label noise floor (noise.py: pooled by step time, every configuration): "
                     f"{s['label_noise_floor']:.1f}%")
    h = s.get("host_probe") or {"n": 0}
    if h["n"]:
        lines.append(f"host issue cost (host_probe.py): n {h['n']}, median {h['median_us']:.2f} us per op, "
                     f"p10-p90 {h['p10_us']:.2f}-{h['p90_us']:.2f} us; changed > 1.5x during a record: "
                     f"{h['changed_during_record']}")
        f = h.get("fresh") or {"n": 0, "no_fault": 0}
        if f["n"]:
            lines.append(f"fresh-mapping cost (host_probe.fresh_fill): n {f['n']}, median {f['median_ms_per_mib']:.2f} "
                         f"ms per MiB, p10-p90 {f['p10_ms_per_mib']:.2f}-{f['p90_ms_per_mib']:.2f}"
                         + (f"; {f['no_fault']} probes took no fault (a reused buffer), left out" if f["no_fault"] else ""))
        elif f["no_fault"]:
            lines.append(f"fresh-mapping cost (host_probe.fresh_fill): {f['no_fault']} probes, none took a fault")
    z = s.get("optimizer_zeros") or {"n": 0}
    if z["n"]:
        worst = sorted(z["by_family"].items(), key=lambda kv: -kv[1]["median"])[:6]
        lines.append(f"zero second moments (optimizer_state.py): n {z['n']}; largest median shares: "
                     + ", ".join(f"{f} {v['median']:.0%} (max {v['max']:.0%})" for f, v in worst))
    c = s.get("collection") or {}
    for mode in ("harvest", "classic"):
        if mode in c:
            m = c[mode]
            lines.append(f"collected ({mode}): {m['records']} records, {m['records_per_min']} per minute of "
                         f"collector time, timed steps {m['timed_share']:.0%}, profiling {m['profile_share']:.0%}")
    if c.get("flags") or c.get("profiled"):
        lines.append(f"flags: {', '.join(f'{k} {v}' for k, v in c['flags'].items()) or 'none'}; "
                     f"profiled records: {c['profiled']}")
    return "\n".join(lines)
