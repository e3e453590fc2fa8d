"""Measure this CPU's compute and memory ceilings with torch, for the CPU roofline baseline.

    taskset -c 0 python benchmarks/cpu_ceilings.py --threads 1

Prints a table: GEMM throughput per dtype (the best of several sizes) and copy bandwidth (bytes read +
written per second). These are machine facts, not training labels; gnn_ptp/hardware.py quotes them.
"""

import argparse
import time

import torch


def best_time(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    print(f"{'what':<28}{'rate':>16}")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        best = 0.0
        for n in (512, 1024, 2048):
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            t = best_time(lambda: torch.mm(a, b))
            best = max(best, 2 * n ** 3 / t)
        print(f"{'gemm ' + str(dtype).split('.')[1]:<28}{best / 1e9:>12.1f} GFLOP/s")
    x = torch.randn(64 * 1024 * 1024 // 4)  # 64 MiB, far beyond the caches
    y = torch.empty_like(x)
    t = best_time(lambda: y.copy_(x))
    print(f"{'copy (read + write)':<28}{2 * x.numel() * 4 / t / 1e9:>12.1f} GB/s")
    t = best_time(lambda: torch.add(x, 1.0, out=y))
    print(f"{'elementwise add':<28}{x.numel() / t / 1e9:>12.1f} GFLOP/s")


if __name__ == "__main__":
    main()
