"""End-to-end time of `gnn-ptp predict`, as a user runs it: a fresh process each time.

    python benchmarks/predict.py                       # the README's table
    python benchmarks/predict.py --hardware cpu        # which shipped checkpoint to use

Rows: cold (no graph cache: every precision class traced, in parallel processes) and warm (the
on-disk graph cache from the cold run), for one precision class and for all the checkpoint knows.
Without an H100 checkpoint, the last rows time what an H100 prediction spends most of its time on: the
H100-target graphs of all six precision classes (4 distinct traces), in a fresh process.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time


def run(args: list[str], env: dict) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gnn_ptp", "predict", *args], env=env, capture_output=True,
                          text=True)
    elapsed = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"gnn-ptp predict {' '.join(args)} failed:\n{done.stderr}")
    return elapsed


GRAPHS_ONLY = r"""
import sys, time
start = time.perf_counter()
from gnn_ptp.cli import _quiet_libraries
_quiet_libraries()
from gnn_ptp.precision import PRECISION_NAMES
from gnn_ptp.prediction import _graphs
from gnn_ptp.spec import Shape, parse_spec
from gnn_ptp.trace import StepConfig
spec, b, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
configs = [StepConfig(parse_spec(spec), Shape(b, s), p, "adamw", "cuda") for p in PRECISION_NAMES]
_graphs(configs, use_disk_cache=False)
print(time.perf_counter() - start)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hardware", default="h100")
    p.add_argument("--spec", default="hf:llama")
    p.add_argument("--batch-size", default="4")
    p.add_argument("--seq-len", default="2048")
    args = p.parse_args()
    cache = tempfile.mkdtemp(prefix="gnn-ptp-bench-")
    env = {**os.environ, "GNN_PTP_CACHE": cache}
    base = [args.spec, "--batch-size", args.batch_size, "--seq-len", args.seq_len, "--hardware", args.hardware]
    print(f"gnn-ptp predict {' '.join(base)}  ({os.cpu_count()} cores)")
    print(f"{'precision':<12}{'graph cache':>14}{'seconds':>10}")
    try:
        for precision in ("amp-bf16", "all"):
            shutil.rmtree(cache, ignore_errors=True)
            for label in ("cold", "warm"):
                seconds = run(base + ["--precision", precision], env)
                print(f"{precision:<12}{label:>14}{seconds:>10.1f}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", GRAPHS_ONLY, args.spec, args.batch_size, args.seq_len],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr)
    print(f"{'H100 graphs, all 6 classes, no cache':<40}{time.perf_counter() - start:>8.1f} s (process)")


if __name__ == "__main__":
    main()
