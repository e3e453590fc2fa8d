"""Hardware profiles: peak rates for the roofline baseline, memory for "will it fit", links for DDP.

GPU rates are NVIDIA datasheet figures (dense, SXM); see ../shared/reference/h100.md. The CPU profile
is measured on this project's 2-core x86_64 machine with one thread by benchmarks/cpu_ceilings.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gnn_ptp.errors import UserError, closest


@dataclass(frozen=True)
class Hardware:
    name: str
    description: str
    flops_per_s: dict[str, float] = field(default_factory=dict)
    """Peak rate per compute dtype (tensor-core rates for tf32/fp16/bf16 on GPUs)."""
    vector_flops_per_s: float = 0.0
    """Rate of ops that cannot use tensor cores (element-wise, reductions)."""
    memory_bandwidth_Bps: float = 0.0
    memory_bytes: float = 0.0
    source: str = ""

    def flops_rate(self, dtype: str, tensor_core: bool) -> float:
        if tensor_core:
            return self.flops_per_s.get(dtype, self.vector_flops_per_s)
        return self.vector_flops_per_s


HARDWARE: dict[str, Hardware] = {
    "h100": Hardware(
        "h100", "NVIDIA H100 SXM5 80GB",
        {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12},
        vector_flops_per_s=67e12, memory_bandwidth_Bps=3.35e12, memory_bytes=80e9,
        source="NVIDIA H100 datasheet, dense"),
    "h200": Hardware(
        "h200", "NVIDIA H200 SXM 141GB",
        {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12},
        vector_flops_per_s=67e12, memory_bandwidth_Bps=4.8e12, memory_bytes=141e9,
        source="NVIDIA H200 datasheet, dense"),
    "cpu": Hardware(
        "cpu", "one thread of an AMD EPYC core (AVX-512, AVX512-BF16), this project's CPU machine",
        {"fp32": 68.6e9, "bf16": 177.6e9, "fp16": 1.1e9},
        vector_flops_per_s=2.6e9, memory_bandwidth_Bps=20.0e9, memory_bytes=24e9,
        source="benchmarks/cpu_ceilings.py --threads 1, measured 2026-11-22"),
}


def get_hardware(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise UserError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}"
                        + closest(name, HARDWARE)) from None
