"""Hardware profiles: peak rates for the physical prior (gnn_ptp/prior.py) and the roofline baseline,
memory for "will it fit", links for DDP.

GPU rates are NVIDIA datasheet figures (dense, SXM); see ../shared/reference/h100.md. The CPU profile
is measured on this project's 2-core x86_64 machine with one thread by benchmarks/cpu_ceilings.py.
How far below these peaks real kernels run (efficiency curves, launch floor) is in
gnn_ptp/prior_calibration.json, fitted by benchmarks/calibrate_prior.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gnn_ptp.errors import UserError, closest


@dataclass(frozen=True)
class Hardware:
    name: str
    description: str
    flops_per_s: dict[str, float] = field(default_factory=dict)
    """Peak GEMM rate per compute dtype: tensor-core rates for tf32/fp16/bf16 on GPUs, the CUDA-core rate
    for fp32 (no TF32); on a CPU the measured GEMM rate per dtype."""
    vector_flops_per_s: float = 0.0
    """Rate of ops that are not GEMMs (element-wise, reductions, norms)."""
    memory_bandwidth_Bps: float = 0.0
    memory_bytes: float = 0.0
    source: str = ""
    kind: str = "gpu"
    """"gpu" or "cpu": a CPU runs its kernels on the thread that issues them (``prior.Profile.serial``)."""
    gemm_layout_ratio: dict[str, float] = field(default_factory=dict)
    """Per "<dtype>:<layout>" ("bf16:tn"; ``ops.GEMM_LAYOUTS``), the measured GEMM rate of that operand
    layout over the nn rate (``descriptor.measure_gemm_layouts``); empty where not measured (every GPU)."""

    depthwise_probe_s: tuple = field(default=(), compare=False)
    """Depthwise convolutions measured apart on this hardware (a CPU descriptor's ``depthwise_probe_s``,
    ``depthwise_table.measure``); empty where not measured. A prior whose section says so prices a
    channels-last one from them (``prior.Profile.depthwise_probes``)."""

    def layout_ratio(self, dtype: str, layout: str) -> float:
        """How much faster than ``flops_rate`` a GEMM of ``layout`` runs in ``dtype`` (1 where unmeasured)."""
        return self.gemm_layout_ratio.get(f"{dtype}:{layout}", 1.0)

    def flops_rate(self, dtype: str, tensor_core: bool, gemm: bool = False) -> float:
        """Peak rate of a kernel: GEMM-like kernels (matmul, convolution, attention; ``gemm``) and
        tensor-core kernels run at the GEMM rate of their dtype (an fp32 matmul on a CPU at the measured
        fp32 GEMM rate, not the element-wise one); everything else, or a dtype without a GEMM rate, at
        the vector rate."""
        if tensor_core or gemm:
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
    "a100": Hardware(
        "a100", "NVIDIA A100 SXM4 80GB",
        {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
        vector_flops_per_s=19.5e12, memory_bandwidth_Bps=2.039e12, memory_bytes=80e9,
        source="NVIDIA A100 datasheet, dense"),
    "cpu": Hardware(
        "cpu", "one thread of an AMD EPYC core (AVX-512, AVX512-BF16), this project's CPU machine",
        {"fp32": 68.6e9, "bf16": 177.6e9, "fp16": 1.1e9},
        vector_flops_per_s=2.6e9, memory_bandwidth_Bps=20.0e9, memory_bytes=24e9,
        source="benchmarks/cpu_ceilings.py --threads 1, measured 2026-11-22", kind="cpu"),
}


def get_hardware(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise UserError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}"
                        + closest(name, HARDWARE)) from None
