"""``gnn-ptp evaluate``: the checkpoint against measurements and against the baselines, on one split.

By default the split is the checkpoint's held-out test families (families the data has gained since
training count as held out too). Every predictor is scored on the same configurations: MAPE, median
and p90 absolute percentage error of the whole step, overall, per precision class and per family.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from gnn_ptp import baselines, checkpoint, dataset, metrics, node_labels
from gnn_ptp.errors import UserError
from gnn_ptp.hardware import get_hardware
from gnn_ptp.train import predict_samples

SPLITS = ("test", "val", "train", "all")
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
"""File types ``--plot`` writes (matplotlib picks the format from the suffix)."""
BASELINE_DIR = "baselines"


def _split_of(meta: dict, family: str) -> str:
    return meta["split"].get(family, "test")  # a family the checkpoint never saw is held out


def evaluate(checkpoint_dir: str | Path, data_dir: str | Path, split: str = "test", plot: str | None = None,
             log=None, strict: bool = False) -> dict:
    if split not in SPLITS:
        raise UserError(f"--split {split!r}: allowed: {', '.join(SPLITS)}")
    log = log or (lambda msg: print(msg, file=sys.stderr))
    model, meta = checkpoint.load(checkpoint_dir)
    labels = checkpoint.trained_labels(meta)  # scored on the labels it was trained on
    measured = dataset.measured_configs(data_dir, strict=strict, label=labels)
    if measured[0].hardware != meta["hardware"]:
        raise UserError(f"checkpoint {checkpoint_dir} predicts {meta['hardware']!r}, "
                        f"data {data_dir} is {measured[0].hardware!r}")
    data_hash = dataset.data_hash(measured)
    # the ridge baseline fitted at training time on this very data: then only the evaluated split needs
    # graphs (a fresh clone traces ~40 graphs instead of ~800)
    ridge = baselines.load_ridge(checkpoint_dir, data_hash)
    if ridge is not None:
        wanted = [m for m in measured if split == "all" or _split_of(meta, m.family) == split]
        if not wanted:
            raise UserError(f"no configurations in the {split} split of {data_dir}")
    else:
        wanted = measured
    samples = dataset.make_samples(wanted, dataset.load_graphs(data_dir, wanted, True, log=log))
    moved_from, kind_of = None, {}
    if model.cfg.needs_hardware:  # each record's own hardware, not the checkpoint's default
        from functools import partial

        from gnn_ptp import descriptor

        over = None
        if model.cfg.target == "log_ratio_prior":  # a CPU kind it was not trained on: its training prior, moved
            over = partial(descriptor.residual_prior_for, model.descriptor,
                           trained_kinds=meta.get("hardware_kinds") or ())
        kind_of = {s.key: d for s, d in zip(samples, descriptor.attach_measured(samples, wanted, over))}
        modes = {d.name: descriptor.moved_mode(d.source, d.target)  # the kinds moved, each with its mode
                 for d in kind_of.values() if isinstance(d, descriptor.MovedPrior)}
        if modes:
            moved_from = {"kinds": sorted(modes), "from": model.descriptor.name, "mode": descriptor.CPU_TRANSFER,
                          "modes": modes}
            how = ", ".join(f"{name} ({modes[name]})" for name in sorted(modes))
            log(f"priced over the prior of {model.descriptor.name}, the kind the checkpoint was trained on, moved "
                f"to {how}: the prior its residual was learned over")
    parts = {name: [s for s in samples if _split_of(meta, s.family) == name] for name in SPLITS[:3]}
    chosen = samples if split == "all" else parts[split]
    if not chosen:
        raise UserError(f"no configurations in the {split} split of {data_dir}")
    precisions = [s.precision for s in chosen]
    families = [s.family for s in chosen]

    p = predict_samples(model, chosen)
    true_ms = p["true_ms"][:, 3]
    result = metrics.report(p["pred_ms"][:, 3], true_ms, precisions, families)
    result["per_phase"] = {phase: metrics.summarize(metrics.ape(p["pred_ms"][:, i], p["true_ms"][:, i]))
                           for i, phase in enumerate(("forward", "backward", "optimizer"))}
    mem_true = np.array([float(s.mem) for s in chosen])
    known = ~np.isnan(mem_true)
    result["memory"] = metrics.summarize(
        metrics.ape(np.exp(p["pred_log_memory"][known]), np.exp(mem_true[known])))
    # kernel level: predicted per-node times against the profiled records' node labels
    chosen_keys = {s.key for s in chosen}
    node_labels.attach(chosen, node_labels.load(data_dir, [m for m in wanted if m.key in chosen_keys], log=log))
    per_op = node_labels.per_op_report(model, chosen) or {}
    result["per_op"] = per_op.get("per_op", {})
    result["matched_share"] = per_op.get("matched_share")
    result["op_share_error"] = per_op.get("share_error")
    result["labelled_steps"] = per_op.get("labelled_steps", 0)

    predictions = {"gnn": p["pred_ms"][:, 3]}
    hw = get_hardware(meta["hardware"])
    others = (sorted({kind_of[s.key].name for s in chosen} - {model.descriptor.name})
              if kind_of and model.descriptor is not None else [])
    if others:  # records of another kind: the prior as this checkpoint sees that kind (attached above)
        from gnn_ptp import descriptor

        predictions["roofline"] = np.array([descriptor.priced_step_ms(s) for s in chosen])
        result["roofline_hardware"] = others
    else:
        predictions["roofline"] = np.array([baselines.roofline_ms(s, hw)[3] for s in chosen])
    if ridge is None and parts["train"] and parts["val"]:  # not this checkpoint's: fitted to this folder
        ridge = baselines.GraphTotalsRidge().fit(parts["train"], parts["val"])
        result["ridge_fitted_here"] = True
    if ridge is not None:
        predictions["graph_totals_ridge"] = ridge.predict_ms(chosen)[:, 3]
    unaware_dir = Path(checkpoint_dir) / BASELINE_DIR / "precision_unaware"
    if (unaware_dir / "meta.json").is_file():
        unaware_model, _ = checkpoint.load(unaware_dir)
        keys = {s.key for s in chosen}
        wanted_unaware = [m for m in measured if m.key in keys]
        unaware_graphs = dataset.load_graphs(data_dir, wanted_unaware, precision_aware=False, log=log)
        unaware = {s.key: s for s in dataset.make_samples(wanted_unaware, unaware_graphs)}
        keep = [i for i, s in enumerate(chosen) if s.key in unaware]
        if len(keep) == len(chosen):
            predictions["precision_unaware"] = predict_samples(unaware_model,
                                                               [unaware[s.key] for s in chosen])["pred_ms"][:, 3]
    else:
        log(f"no precision-unaware baseline at {unaware_dir} (train with --baselines to make one)")

    result["baselines"] = {name: metrics.report(pred, true_ms, precisions, families)
                           for name, pred in predictions.items() if name != "gnn"}
    scores = {name: metrics.summarize(metrics.ape(pred, true_ms))["mape"] for name, pred in predictions.items()}
    best_baseline = min((n for n in scores if n != "gnn"), key=lambda n: scores[n])
    result["winner"] = min(scores, key=lambda n: scores[n])
    result["gnn_vs_best_baseline"] = {"baseline": best_baseline,
                                      "mape_ratio": scores[best_baseline] / scores["gnn"] if scores["gnn"] else None}
    if moved_from:
        result["prior_moved"] = moved_from
    result.update(checkpoint=str(checkpoint_dir), data=str(data_dir), split=split, hardware=meta["hardware"],
                  labels=labels, correction_scale=model.correction_scale,
                  correction_scale_by=checkpoint.scale_source(meta),
                  **({"ensemble": checkpoint.ensemble_note(meta)} if meta.get("ensemble") else {}),
                  **({"beyond": beyond} if (beyond := checkpoint.beyond_note(meta)) else {}),
                  held_out_families=sorted(set(families)) if split == "test" else None,
                  trained_on_data_hash=meta.get("data_hash"), data_hash=data_hash)
    if plot:
        parity_plot(p["pred_ms"][:, 3], true_ms, precisions, plot,
                    title=f"{meta['hardware']} step time, {split} split (MAPE {scores['gnn']:.1f}%)")
        result["plot"] = plot
    return result


def parity_plot(pred, true, precisions, path, title="") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gnn_ptp.precision import PRECISION_NAMES

    fig, ax = plt.subplots(figsize=(5.5, 5), dpi=130)
    colors = dict(zip(PRECISION_NAMES, plt.get_cmap("tab10").colors))
    for name in PRECISION_NAMES:
        idx = [i for i, p in enumerate(precisions) if p == name]
        if idx:
            ax.scatter(np.asarray(true)[idx], np.asarray(pred)[idx], s=14, alpha=0.75, label=name,
                       color=colors[name])
    lo, hi = min(np.min(pred), np.min(true)) * 0.8, max(np.max(pred), np.max(true)) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    for factor in (0.9, 1.1):
        ax.plot([lo, hi], [lo * factor, hi * factor], color="grey", lw=0.5, ls="--")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step time (ms)",
           ylabel="predicted step time (ms)", title=title)
    ax.legend(title="precision", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def format_table(r: dict) -> str:
    def pct(x):
        return "   -  " if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:5.1f}%"

    names = ["gnn"] + list(r["baselines"])
    rows = {"gnn": r, **r["baselines"]}
    label = {"gnn": "gnn (precision-aware)", "precision_unaware": "gnn, precision-unaware",
             "roofline": "roofline (calibrated)", "graph_totals_ridge": "ridge on graph totals"}
    head = f"{r['hardware']} checkpoint {r['checkpoint']} on {r['data']}, {r['split']} split"
    if r.get("held_out_families"):
        head += f" (held-out families: {', '.join(r['held_out_families'])})"
    lines = [head]
    if r.get("labels", "mean") != "mean":
        lines.append(f"labels: each configuration's {r['labels']} record, as the checkpoint was trained on")
    scaled = checkpoint.scale_note(r.get("correction_scale", 1.0), r.get("correction_scale_by", "validation"))
    if scaled:
        lines.append(f"gnn: {scaled} (the roofline row is the prior alone)")
    if r.get("ensemble"):
        lines.append(f"gnn: {r['ensemble']}")
    if r.get("beyond"):
        lines.append(f"gnn: {r['beyond']}")
    if r.get("prior_moved"):
        m = r["prior_moved"]
        modes = m.get("modes") or {}
        lines.append(f"gnn priced over the prior of {m['from']} (the kind it was trained on) moved to "
                     + ", ".join(f"{k} ({modes.get(k, m['mode'])})" for k in m["kinds"]))
    if r.get("roofline_hardware"):
        lines.append(f"roofline: the prior as the gnn sees {', '.join(r['roofline_hardware'])}"
                     + ("; the ridge is fitted to this folder's own training families" if r.get("ridge_fitted_here")
                        else ""))
    lines += ["", f"{'step time':<26}{'MAPE':>8}{'median':>8}{'p90':>8}{'n':>6}"]
    for n in names:
        o = rows[n]["overall"]
        lines.append(f"{label.get(n, n):<26}{pct(o['mape']):>8}{pct(o['median_ape']):>8}{pct(o['p90_ape']):>8}"
                     f"{o['n']:>6}")
    short = {"gnn": "gnn", "precision_unaware": "unaware gnn", "roofline": "roofline",
             "graph_totals_ridge": "ridge"}
    for group in ("per_precision", "per_family"):
        keys = list(r[group])
        lines += ["", f"{'MAPE ' + group[4:]:<20}" + "".join(f"{short.get(n, n)[:14]:>16}" for n in names)]
        for k in keys:
            lines.append(f"{k:<20}" + "".join(f"{pct(rows[n][group].get(k, {}).get('mape')):>16}" for n in names))
    phases = ", ".join(f"{k} {pct(v['mape']).strip()}" for k, v in r["per_phase"].items())
    lines += ["", f"gnn per phase MAPE: {phases}"]
    if r["memory"]["n"]:
        lines.append(f"gnn peak memory MAPE: {pct(r['memory']['mape']).strip()} (n {r['memory']['n']})")
    if "per_op" in r:
        lines += node_labels.format_per_op({"per_op": r["per_op"], "matched_share": r["matched_share"],
                                            "share_error": r["op_share_error"],
                                            "labelled_steps": r["labelled_steps"]})
    v = r["gnn_vs_best_baseline"]
    if r["winner"] == "gnn" and v["mape_ratio"]:
        lines.append(f"winner: gnn, {v['mape_ratio']:.1f}x lower MAPE than the best baseline ({v['baseline']})")
    else:
        lines.append(f"winner: {r['winner']} (the gnn does not beat it on this split)")
    if r.get("plot"):
        lines.append(f"parity plot: {r['plot']}")
    return "\n".join(lines)
