"""Host-bound phases: how much of their time a count of kernels explains, and how much the host's state.

    python benchmarks/host_bound.py --data datasets/h200

A phase is host-bound when its kernels' device time (measured by its per-op profile where a node was
matched, the shipped prior's elsewhere) is under ``--device-share`` of its measured time: the GPU idles,
waiting for the host to issue. Per phase, the best least-squares host model a graph can feed (a fixed cost
plus a cost per issued kernel, the autocast casts, which C++ issues inside another op, priced apart; the
optimizer per parameter tensor) is fitted to all of them, and its log residual is split by session (the
loan: records of a configuration start a new session more than ``--session-h`` hours after the last one):
the spread of session means (each against the mean of all) is the host's speed from one machine to the next, the sd within a session what
is left. Beside it, the run-to-run noise of the host-bound configurations measured twice. Nothing here is
a prediction: it bounds what any step model without a measure of the host can reach on these steps.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp import ops, prior, prior_fit  # noqa: E402
from gnn_ptp.noise import relative_sd  # noqa: E402
from gnn_ptp.records import iter_records  # noqa: E402

CAST = ops.OP_ID["to_copy"]


def sessions(folder: Path, gap_h: float) -> tuple[dict, dict]:
    """({configuration key: session label of its first record}, {key: [step ms of every record]})."""
    stamps, steps = defaultdict(list), defaultdict(list)
    for r in iter_records(folder, warn=lambda _: None, strict=False):
        if r.get("status") == "ok" and (r.get("ddp") or {}).get("world_size", 1) == 1:
            stamps[r["key"]].append(datetime.fromisoformat(r["timestamp"]))
            steps[r["key"]].append(float(r["timing"]["step_ms"]["median"]))
    starts = sorted({t for v in stamps.values() for t in v})
    label, names, last = {}, [], None
    for t in starts:  # a new session after a gap of more than gap_h hours
        if last is None or (t - last).total_seconds() > gap_h * 3600:
            names.append(t.strftime("%Y-%m-%d %H:%M"))
        label[t] = names[-1]
        last = t
    return {k: label[min(v)] for k, v in stamps.items()}, dict(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a GPU dataset folder with per-op profiles")
    ap.add_argument("--device-share", type=float, default=0.25,
                    help="a phase is host-bound when its kernels take less than this share of it")
    ap.add_argument("--session-h", type=float, default=3.0, help="a gap that starts a new session (hours)")
    args = ap.parse_args()
    if not args.data.is_dir():
        ap.error(f"--data {args.data}: not a folder")
    if not 0 < args.device_share < 1:
        ap.error(f"--device-share {args.device_share:g}: must be between 0 and 1")
    hw, samples, node_seconds = prior_fit.load_profiled(args.data)
    if hw.kind != "gpu":
        ap.error(f"--data {args.data}: {hw.name} is not a GPU (a CPU step is serial: nothing is host-bound)")
    profile = prior.get_profile(hw)
    session, steps = sessions(args.data, args.session_h)
    rows = defaultdict(list)  # phase -> (features, measured s, session, key)
    for s in samples:
        per = node_seconds.get(s.key)
        measured = prior_fit.measured_node_seconds(s, per) if per else None
        if measured is None:
            continue
        t = prior.node_seconds(s.x, s.x_cat, profile, getattr(s, "fresh_bytes", None),
                                       getattr(s, "gemm_layout", None))
        t = torch.where(torch.isnan(measured) | (measured <= 0), t, measured.double())
        phase_s = s.y[0, :3].double().exp().numpy() * 1e-3
        for p in range(3):
            on = s.phase == p
            if not on.any() or float(t[on].sum()) >= args.device_share * phase_s[p]:
                continue
            if p == 2:
                x = [1.0, float((s.grad_bytes > 0).sum()), 0.0]
            else:
                casts = float((s.x_cat[on, 0] == CAST).sum())
                x = [1.0, float(on.sum()) - casts, casts]
            rows[p].append((x, phase_s[p], session.get(s.key, "?"), s.key))
    print(f"{args.data}: {len(samples)} configurations on {hw.description}; host-bound: kernels < "
          f"{args.device_share:.0%} of the phase; sessions: gaps > {args.session_h:g} h\n")
    for p, name in enumerate(prior.PHASE_NAMES):
        if len(rows[p]) < 10:
            print(f"{name}: {len(rows[p])} host-bound phases, too few to fit\n")
            continue
        X = np.array([r[0] for r in rows[p]])
        y = np.array([r[1] for r in rows[p]])
        cols = X.any(0)
        A = X[:, cols] / y[:, None]
        coef = np.linalg.lstsq(A, np.ones(len(y)), rcond=None)[0]
        res = np.log(A @ coef)
        names = np.array(["fixed", "per tensor" if p == 2 else "per kernel", "per cast"])[cols]
        print(f"{name}: {len(y)} host-bound phases; fitted " + ", ".join(f"{n} {c * 1e6:.1f} us" for n, c in zip(names, coef))
              + f"; MAPE {np.abs(np.exp(res) - 1).mean() * 100:.1f} %, log residual sd {res.std() * 100:.1f} %")
        labels = np.array([r[2] for r in rows[p]])
        within = 0.0
        for lab in sorted(set(labels)):
            on = labels == lab
            within += on.sum() * res[on].var()
            print(f"   session {lab:<18} n {on.sum():4d}   mean residual {(res[on].mean() - res.mean()) * 100:+6.1f} % "
                  f"(against all)   sd {res[on].std() * 100:5.1f} %")
        keys = {r[3] for r in rows[p]}
        noise = [relative_sd(steps[k]) for k in keys if len(steps.get(k, ())) >= 2]
        print(f"   within sessions sd {np.sqrt(within / len(res)) * 100:.1f} %; the same configurations measured "
              f"twice or more ({len(noise)}): step sd {np.mean(noise) * 100 if noise else float('nan'):.1f} % per measurement\n")


if __name__ == "__main__":
    main()
