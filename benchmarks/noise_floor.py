"""How noisy a dataset's labels are, by step time: the label noise floor the protocol prints, explained.

    python benchmarks/noise_floor.py --data datasets/h200

From the records alone (nothing traced): per step-time band, how many configurations were measured more
than once, their per-measurement relative sd (``noise.relative_sd``, averaged), split into repeats of one
session (pairs of a configuration's records less than ``--session-h`` hours apart: back to back on one
machine) and across sessions (another loan, another day), each configuration's pairs averaged, and the noise floor of every configuration in the band
(``noise.NoiseFloor``: what a perfect predictor of the true mean scores against the labels). Then the floor
over all configurations and per family, beside the older definition (only the repeated configurations,
each with its own sd and n), which leaves out the labels measured once.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gnn_ptp.noise import NoiseFloor, relative_sd  # noqa: E402

BANDS_MS = (0, 3, 10, 30, 100, 300, 1000, math.inf)


def read(folder: Path) -> tuple[dict, dict, dict]:
    """(repeats {(hardware, key): [step ms]}, times {key: [datetime]}, family {key: family}) of the ok
    single-process records of ``folder``."""
    from gnn_ptp.records import iter_records

    repeats, times, family = defaultdict(list), defaultdict(list), {}
    for r in iter_records(folder, warn=lambda _: None, strict=False):
        if r.get("status") != "ok" or (r.get("ddp") or {}).get("world_size", 1) != 1:
            continue
        key = (r["env"]["hardware"], r["key"])
        repeats[key].append(float(r["timing"]["step_ms"]["median"]))
        times[key].append(datetime.fromisoformat(r["timestamp"]))
        family[key] = r.get("family") or "?"
    return dict(repeats), dict(times), family


def old_floor(keys, repeats) -> float | None:
    """The definition the protocol used before ``noise.py``: repeated configurations, their own sd and n."""
    v = [math.sqrt(2 / math.pi) * np.std(repeats[k], ddof=1) / np.mean(repeats[k]) / math.sqrt(len(repeats[k])) * 100
         for k in keys if len(repeats[k]) >= 2]
    return float(np.mean(v)) if v else None


def _pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}%"


def report(folder: Path, session_h: float) -> None:
    repeats, times, family = read(folder)
    if not repeats:
        print(f"error: --data {folder}: no ok single-process records", file=sys.stderr)
        raise SystemExit(2)
    nf = NoiseFloor(repeats)
    print(f"{folder}: {len(repeats)} configurations, {sum(len(v) >= 2 for v in repeats.values())} measured "
          f"twice or more; sessions: records < {session_h:g} h apart\n")
    print(f"{'step ms':<12}{'configs':>8}{'repeated':>9}{'sd/mean':>9}{'same session':>14}{'across':>12}{'floor':>8}")
    for lo, hi in zip(BANDS_MS, BANDS_MS[1:]):
        keys = [k for k, v in repeats.items() if lo <= np.mean(v) < hi]
        if not keys:
            continue
        sds, same, across = [], [], []
        for k in keys:
            v = repeats[k]
            if len(v) < 2:
                continue
            sds.append(relative_sd(v))
            pairs = {True: [], False: []}  # every pair of the configuration's records, by session
            for i in range(len(v)):
                for j in range(i + 1, len(v)):
                    gap_h = abs((times[k][j] - times[k][i]).total_seconds()) / 3600
                    pairs[gap_h < session_h].append(relative_sd([v[i], v[j]]))
            if pairs[True]:
                same.append(np.mean(pairs[True]))
            if pairs[False]:
                across.append(np.mean(pairs[False]))
        band = f"{lo:g}-{hi:g}" if hi < math.inf else f">= {lo:g}"
        mean = lambda x: float(np.mean(x)) * 100 if x else None  # noqa: E731
        print(f"{band:<12}{len(keys):>8}{len(sds):>9}{_pct(mean(sds)):>9}"
              f"{_pct(mean(same)) + f' ({len(same)})':>14}{_pct(mean(across)) + f' ({len(across)})':>12}"
              f"{_pct(nf.floor(keys)):>8}")
    keys = list(repeats)
    print(f"\nlabel noise floor, all {len(keys)} configurations: {_pct(nf.floor(keys))} "
          f"(repeated configurations only, own sd and n: {_pct(old_floor(keys, repeats))})")
    print(f"\n{'family':<22}{'configs':>8}{'floor':>8}{'repeated only':>15}")
    for f in sorted(set(family.values())):
        fk = [k for k in keys if family[k] == f]
        print(f"{f:<22}{len(fk):>8}{_pct(nf.floor(fk)):>8}{_pct(old_floor(fk, repeats)):>15}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, action="append", required=True, help="a dataset folder (repeatable)")
    ap.add_argument("--session-h", type=float, default=3.0,
                    help="records of one configuration less than this many hours apart are one session")
    args = ap.parse_args()
    for folder in args.data:
        if not folder.is_dir():
            ap.error(f"--data {folder}: not a folder")
    if args.session_h <= 0:
        ap.error(f"--session-h {args.session_h:g}: must be positive")
    for i, folder in enumerate(args.data):
        if i:
            print()
        report(folder, args.session_h)


if __name__ == "__main__":
    main()
