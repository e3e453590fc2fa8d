"""Trace + convert time and peak memory of big configs, each in a fresh process, under amp-bf16.

    python benchmarks/trace.py            # the table in the README
    python benchmarks/trace.py --models llama-7b --threads 2

Columns: import (torch, transformers, PyG, gnn_ptp), the first trace + graph conversion in the process
(what `gnn-ptp graph` pays), a second one of the same model at another batch size (warm: modules
imported, fake-tensor caches filled), and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

MODELS = {
    "llama-7b": ("hf:llama", [], dict(seq_len=2048), 4),
    "llama-70b-size": ("hf:llama", ["num_hidden_layers=80", "hidden_size=8192", "intermediate_size=28672",
                                    "num_attention_heads=64", "num_key_value_heads=8"], dict(seq_len=2048), 1),
    "gpt2-48-layers": ("hf:gpt2", ["n_layer=48"], dict(seq_len=1024), 8),
    "bert-base": ("hf:bert", [], dict(seq_len=512), 32),
    "resnet-50": ("torchvision:resnet50", [], dict(image_size=224), 64),
    "vit-b-16": ("torchvision:vit_b_16", [], dict(image_size=224), 64),
}


def one(name: str, threads: int | None) -> dict:
    start = time.perf_counter()
    import torch

    if threads:
        torch.set_num_threads(threads)
    import torch_geometric.data  # noqa: F401
    import transformers  # noqa: F401

    from gnn_ptp.cli import _quiet_libraries
    from gnn_ptp.graph import to_data
    from gnn_ptp.spec import Shape, parse_spec
    from gnn_ptp.trace import StepConfig, trace_step

    _quiet_libraries()
    imported = time.perf_counter()
    spec, overrides, dims, batch = MODELS[name]
    results = {}
    for label, b in (("cold", batch), ("warm", batch * 2)):
        t0 = time.perf_counter()
        traced = trace_step(StepConfig(parse_spec(spec, overrides), Shape(b, **dims), "amp-bf16"))
        t1 = time.perf_counter()
        _, summary = to_data(traced)
        t2 = time.perf_counter()
        results[label] = {"trace_s": t1 - t0, "convert_s": t2 - t1, "total_s": t2 - t0}
    return {"model": name, "import_s": imported - start, **results, "traced_ops": summary.traced_nodes,
            "nodes": summary.nodes, "params": traced.param_count,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.threads)))
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; every model in a fresh process")
    print(f"{'model':<16}{'params':>8}{'ops':>7}{'nodes':>7}{'import':>8}{'1st trace+conv':>16}"
          f"{'2nd trace+conv':>16}{'peak RSS':>10}")
    for name in args.models:
        cmd = [sys.executable, __file__, "--one", name] + (["--threads", str(args.threads)] if args.threads else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(f"{name:<16} failed: {out.stderr.strip().splitlines()[-1]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        cold, warm = r["cold"], r["warm"]
        print(f"{name:<16}{r['params'] / 1e9:>7.2f}B{r['traced_ops']:>7}{r['nodes']:>7}{r['import_s']:>7.1f}s"
              f"{cold['trace_s']:>9.1f}+{cold['convert_s']:.1f}s{warm['trace_s']:>9.1f}+{warm['convert_s']:.1f}s"
              f"{r['peak_rss_gb']:>8.2f}GB")


if __name__ == "__main__":
    main()
