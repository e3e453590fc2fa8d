"""Measure this CPU's ceilings (its hardware descriptor) with torch.

    flock /tmp/gnn-ptp-measure.lock taskset -c 1 python benchmarks/cpu_ceilings.py --threads 1 [--write]

Prints GEMM throughput per dtype (the best of several sizes), the in-cache element-wise rate, copy
bandwidth (bytes read + written per second), the launch floor and the seconds of the step-sized probe
kernels (forward + backward at a training step's sizes, which move a prior between two kinds that both
have them) and what a fresh allocation costs above the allocator's mmap threshold, measured by ``gnn_ptp.descriptor.measure_cpu``; ``--write`` stores them as this CPU model's
descriptor in ``gnn_ptp/hardware_descriptors/`` (what a checkpoint with ``hardware_descriptor`` or
``target = "log_ratio_prior"`` reads for records of this CPU). These are machine facts, not training labels.
Before the descriptor existed this script printed an element-wise add over 64 MiB (memory-bound) as the
element-wise rate: the 2.6 GFLOP/s that ``gnn_ptp/hardware.py`` quotes for the prior's reference CPU.
"""

import argparse
import sys

from gnn_ptp import descriptor


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--write", action="store_true", help="store as this CPU model's descriptor")
    args = p.parse_args()
    d = descriptor.measure_cpu(args.threads)
    print(f"{d.description}: {d.source}")
    print(f"{'what':<28}{'rate':>16}")
    for dtype in ("fp32", "bf16", "fp16"):
        print(f"{'gemm ' + dtype:<28}{d.gemm_flops_per_s[dtype] / 1e9:>12.1f} GFLOP/s")
    print(f"{'element-wise (in cache)':<28}{d.vector_flops_per_s / 1e9:>12.1f} GFLOP/s")
    print(f"{'copy (read + write)':<28}{d.memory_bandwidth_Bps / 1e9:>12.1f} GB/s")
    print(f"{'launch floor':<28}{d.launch_floor_s * 1e6:>12.2f} us")
    fresh = d.fresh_alloc
    if fresh.get("threshold_bytes") is not None:
        print(f"{'fresh allocation':<28}{fresh['ms_per_MiB']:>12.3f} ms/MiB above {fresh['threshold_bytes'] / 2 ** 20:.1f} MiB "
              "(page faults)")
    elif fresh:
        print(f"{'fresh allocation':<28}{'no cost':>16} (no size up to 128 MiB was costly)")
    for group, seconds in d.step_probe_s.items():
        print(f"{'step probes, ' + group:<28}{sum(seconds.values()) * 1e3:>12.2f} ms ({len(seconds)} probes, "
              f"forward + backward; {d.probe_suite})")
    if args.write:
        print(f"written to {descriptor.write(d)}", file=sys.stderr)


if __name__ == "__main__":
    main()
