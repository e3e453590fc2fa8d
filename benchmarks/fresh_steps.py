"""A checkpoint on configurations measured apart from its training data (README *Protocol*, "Fresh steps for the
size protocol", run (37)): as it answers, with its correction faded beyond each model's training range (the
factor for larger steps at 0: ``TrainConfig.beyond_scale``), and the physical prior alone, by where the steps lie
against the models' training ranges. Prints a table.

    python benchmarks/fresh_steps.py --checkpoint checkpoints/cpu --data datasets/cpu \
        --fresh datasets/cpu/cpu-size-fresh-2026-12-06

``--data`` is the checkpoint's training folder: each model's largest training step (by FLOPs) is read from its
training families there, as ``train`` records it for a factor for larger steps."""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _samples(folder, meta, model, label: str, log):
    from functools import partial

    from gnn_ptp import dataset, descriptor

    measured = dataset.measured_configs(folder, label=label)
    samples = dataset.make_samples(measured, dataset.load_graphs(folder, measured, True, log=log))
    over = partial(descriptor.residual_prior_for, model.descriptor, trained_kinds=meta.get("hardware_kinds") or ())
    descriptor.attach_measured(samples, measured, over)  # as ``evaluate`` prices a checkpoint's steps
    return samples


def training_maxima(meta: dict, samples: list) -> list[float]:
    """Each model's largest training step by FLOPs: the checkpoint's training families less the model's own
    validation families (each member's for a seed ensemble), as ``train`` computes it."""
    from gnn_ptp.checkpoint import model_records
    from gnn_ptp.protocol import step_flops

    train_families = {f for f, part in meta["split"].items() if part == "train"}
    out = []
    for record in model_records(meta):
        val = set(record.get("val_families") or [f for f, part in meta["split"].items() if part == "val"])
        out.append(max(step_flops(s) for s in samples if s.family in train_families - val))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="checkpoints/cpu")
    ap.add_argument("--data", default="datasets/cpu", help="the checkpoint's training folder")
    ap.add_argument("--fresh", required=True, help="the folder of configurations measured apart")
    ap.add_argument("--seen", action="append", metavar="DIR",
                    help="(repeatable) a folder of configurations already seen (an earlier fresh set a form was "
                         "chosen on): a --fresh configuration also there is left out")
    args = ap.parse_args(argv)

    from gnn_ptp import checkpoint, metrics
    from gnn_ptp.protocol import seen_keys, step_flops
    from gnn_ptp.train import predict_samples

    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    seen = seen_keys(args.seen or ())  # a wrong --seen folder: one line (run_script), before any work
    model, meta = checkpoint.load(args.checkpoint)
    label = checkpoint.trained_labels(meta)
    members = list(getattr(model, "members", None) or [model])
    trained = _samples(args.data, meta, model, label, log)
    tops = training_maxima(meta, trained)
    held = {s.key for s in trained}
    every = _samples(args.fresh, meta, model, label, log)
    fresh = [s for s in every if s.key not in held and s.key not in seen]  # one trained on or seen is not fresh
    if not fresh:
        raise SystemExit(f"--fresh {args.fresh}: every configuration is also in --data {args.data} or --seen; "
                         "nothing fresh")
    faded = copy.deepcopy(model)
    for member, top in zip(list(getattr(faded, "members", None) or [faded]), tops):
        member.beyond_scale, member.train_max_flops = 0.0, top
    flops = np.array([step_flops(s) for s in fresh])
    true = np.array([float(np.exp(s.y[0, 3])) for s in fresh])
    rows = {"as it answers": predict_samples(model, fresh)["pred_ms"][:, 3],
            "faded beyond the range": predict_samples(faded, fresh)["pred_ms"][:, 3],
            "the prior alone": np.array([float(s.prior_log_ms.double().exp().sum()) for s in fresh])}
    if len(members) > 1:
        for i, (member, top) in enumerate(zip(members, tops)):
            rows[f"member {i} as it answers"] = predict_samples(member, fresh)["pred_ms"][:, 3]
    groups = {"every fresh step": np.ones(len(fresh), bool),
              f"within every model's range (<= {min(tops):.3g} FLOPs)": flops <= min(tops),
              f"beyond every model's range (> {max(tops):.3g})": flops > max(tops),
              f"2x beyond or more (>= {2 * max(tops):.3g})": flops >= 2 * max(tops)}
    print(f"{args.checkpoint} on {args.fresh}: {len(fresh)} configurations, {flops.min():.3g}-{flops.max():.3g} FLOPs, "
          f"{true.min():.0f}-{true.max():.0f} ms ({label} labels; {len(every) - len(fresh)} also in {args.data}"
          + (" or " + ", ".join(args.seen) if args.seen else "") + ", left out); its models' largest training steps "
          + ", ".join(f"{t:.3g}" for t in tops) + " FLOPs")
    names = list(groups)
    print(f"{'MAPE %':<28}" + "".join(f"{n.split(' (')[0]:>30}" for n in names))
    print(f"{'steps':<28}" + "".join(f"{int(groups[n].sum()):>30}" for n in names))
    for row, pred in rows.items():
        print(f"{row:<28}" + "".join(
            f"{metrics.ape(pred[groups[n]], true[groups[n]]).mean() if groups[n].any() else float('nan'):>30.2f}"
            for n in names))
    print()
    print(f"{'family':<20}{'n':>3}" + "".join(f"{r:>24}" for r in list(rows)[:3]))
    families = sorted({s.family for s in fresh})
    for f in families:
        m = np.array([s.family == f for s in fresh])
        print(f"{f:<20}{int(m.sum()):>3}" + "".join(f"{metrics.ape(rows[r][m], true[m]).mean():>24.2f}"
                                                   for r in list(rows)[:3]))
    return 0


if __name__ == "__main__":
    from gnn_ptp.errors import run_script

    run_script(main)
