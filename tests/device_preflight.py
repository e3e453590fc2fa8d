"""The device preflight: run in an environment with the lent GPU image's versions (CI's .venv-device:
torch 2.11, transformers 5.17, torchvision 0.26, timm, torch-geometric 2.8; no optuna, no wandb), so that
first contact with a GPU does not fail on a version.

    PYTHONPATH=. .venv-device/bin/python tests/device_preflight.py <scratch folder>

1. builds every model of the H100 grid on the meta device (what the collector checks before measuring);
2. runs the harvest loop on the CPU over training/grids/preflight.toml (one tiny model per source), with a
   profiled step for every record, and checks the records and profiles;
3. traces tiny models for the H100 target and compares a real CPU step with its trace
   (benchmarks/gpu_agreement.py --device cpu --small, two models, two classes).
Prints one line per check and exits non-zero at the first failure.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(scratch: Path) -> int:
    import torch

    from gnn_ptp import cli, profiles, records
    from gnn_ptp.collect import _validate_specs
    from gnn_ptp.grid import load_grid

    versions = {m: importlib.util.find_spec(m) is not None for m in ("optuna", "wandb")}
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, optional packages present: {versions}")

    start = time.perf_counter()
    name, configs = load_grid(ROOT / "training" / "grids" / "h100.toml")
    _validate_specs(configs)
    specs = {(c["spec"], str(c["set"])) for c in configs}
    skipped = sum("_skip" in c for c in configs)
    print(f"ok: {len(specs)} models of the {name} grid ({len(configs)} configurations, {skipped} skipped by its "
          f"rules on this torch) build on the meta device ({time.perf_counter() - start:.1f} s)")

    out = scratch / "cpu"
    start = time.perf_counter()
    code = cli.main(["collect", "--grid", str(ROOT / "training" / "grids" / "preflight.toml"), "--out", str(out),
                     "--device", "cpu", "--threads", "1", "--warmup-steps", "1", "--harvest-steps", "3",
                     "--harvest-min-steps", "2", "--harvest-time-s", "0.05", "--profile", "all"])
    rows = list(records.iter_records(out))
    bad = [r for r in rows if r["status"] != "ok"]
    if code != 0 or not rows or bad:
        print(f"FAIL: harvest exit {code}, {len(rows)} records, not ok: "
              f"{[(r['config']['spec'], r['config']['precision'], r['error']) for r in bad]}")
        return 1
    found = profiles.read_profiles(out)
    if {r["id"] for r in rows} != set(found) or any(not p["ops"] for p in found.values()):
        print("FAIL: a record without its profile, or an empty profile")
        return 1
    if not all(any(sig[1] for sig in p["sigs"]) for p in found.values()):
        print("FAIL: profiles without input dtypes")
        return 1
    print(f"ok: harvest on the CPU, {len(rows)} records with profiles ({time.perf_counter() - start:.1f} s)")

    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_agreement.py"), "--device", "cpu",
                           "--small", "--models", "llama-7b-width-2-layers", "resnet-50",
                           "--precisions", "fp32", "amp-bf16"], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        print(f"FAIL: gpu_agreement.py exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return 1
    print(f"ok: traces for the H100 target and the CPU step agreement ({time.perf_counter() - start:.1f} s)")
    print(done.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
