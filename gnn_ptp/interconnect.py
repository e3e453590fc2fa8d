"""Interconnect profiles: which all-reduce line applies to p GPUs on n nodes, as a named, saveable object.

A profile has an intra-node level (NVLink/NVSwitch, or gloo over loopback on a CPU) and optionally an
inter-node level (InfiniBand); each level is one or more ``comm.Fabric`` fits, each anchored at the world
size it was measured at. A job on one node uses the intra-node level, a job on several nodes the
inter-node one (NCCL's hierarchical algorithms: NVLink inside a node, the NICs between nodes, so the
measured multi-node line already contains both). Within a level the fit measured at the nearest world
size is used, scaled as ``Fabric`` documents; anything not measured is flagged as an extrapolation.

Shipped profiles (``gnn-ptp comm --list``):
- ``h100-nvswitch``: one node of 8 H100 SXM, NVLink4/NVSwitch (fitted on NVIDIA's and Voltage Park's
  ``all_reduce_perf`` output, ``nccl_allreduce_h100.csv``);
- ``h100-ib-ndr400``: nodes of 8 H100 SXM with 8x NDR400 InfiniBand each (the same NVLink fit inside a
  node; the 32-GPU, 4-node Voltage Park run between nodes);
- ``cpu-gloo``: gloo over loopback on the 2-core machine the CPU dataset was measured on, written by
  ``gnn-ptp calibrate-comm`` there. Its ranks share the cores that compute: nothing overlaps, and more
  ranks than cores slow the compute down.

``gnn-ptp calibrate-comm`` writes a profile file from measurements on any cluster (torchrun + NCCL) or
one machine (gloo); ``predict --interconnect FILE`` and ``comm --interconnect FILE`` read it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from gnn_ptp.comm import GPUS_PER_NODE, Fabric, fabrics
from gnn_ptp.errors import UserError

SCHEMA = 1
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
"""What ``calibrate-comm --collectives`` measures; the all-reduce lines are the profile's levels."""
PACKAGED_DIR = "interconnects"
"""Profiles shipped as package data (gnn_ptp/interconnects/*.json), besides the two built from the CSV."""


@dataclass(frozen=True)
class AllReduceTime:
    """One all-reduce as nccl-tests reports it."""

    message_bytes: float
    gpus: int
    nodes: int
    time_us: float
    algbw_GBps: float
    """message_bytes / time."""
    busbw_GBps: float
    """algbw * 2(p-1)/p: comparable across world sizes (nccl-tests' definition)."""
    algorithm: str
    level: str
    """Which fit answered (its name)."""
    interconnect: str
    measured: bool
    """False when the world size is not one the fit was measured at (an extrapolation)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Interconnect:
    name: str
    description: str
    gpus_per_node: int
    """Ranks on one node (8 GPUs an H100 node; on a CPU, as many ranks as you start)."""
    intra: tuple[Fabric, ...]
    """Fits for ranks within one node, one per measured world size."""
    inter: tuple[Fabric, ...] = ()
    """Fits across nodes (empty: the profile is one node)."""
    overlap: bool = True
    """Whether all-reduces run beside the backward pass (GPUs: NCCL on its own stream). False on a CPU
    whose cores the backward fills: the reduction waits and all of it is exposed."""
    compute_slots: int | None = None
    """Ranks one node runs at full speed at once (CPU: its cores at one thread a rank). With more ranks,
    compute slows by ranks / compute_slots. None: every rank has its own device (GPUs)."""
    hardware: tuple[str, ...] = ()
    """Hardware this profile is the default for."""
    source: str = ""
    env: dict = field(default_factory=dict)
    """Where a calibrated profile was measured (hosts, torch, backend, date)."""
    measurements: tuple[dict, ...] = ()
    """The rows a calibrated profile was fitted on (gpus, message_bytes, time_us)."""
    node_sharing: dict = field(default_factory=dict)
    """Measured by calibrate-comm on one machine, per rank count (str): ``compute_slowdown`` (a rank's
    reference work, all ranks busy vs alone: the median of the rounds kept in ``compute_slowdown_rounds``, or
    one measurement in profiles older than the rounds) and ``copy_GBps`` (a rank's memory-copy bandwidth,
    all ranks copying). Where present, they replace ranks / compute_slots and add DDP's two gradient copies."""
    collectives: dict = field(default_factory=dict)
    """Lines measured for other collectives than the all-reduce (``calibrate-comm --collectives``):
    ``{"all_gather" | "reduce_scatter": {"intra": (Fabric, ...), "inter": (...)}}``, each an alpha-beta
    line fitted through that collective's own times at the unsharded tensor size (its ``busbw_GBps`` is in
    all-reduce units: ``Fabric.allreduce_us`` of it is the collective's time). Where none is measured for a
    level, ``collective_us`` derives it from the all-reduce (NCCL's ring: half the latency, half the bytes)."""

    fsdp: dict = field(default_factory=dict)
    """FSDP2's host overheads measured on synthetic stacks (``calibrate-comm --fsdp``), per rank count on
    one node (str): ``fsdp.Overheads`` fields and the stacks' residuals. Empty: none (GPU profiles)."""

    def fsdp_overheads(self, gpus: int, nodes: int | None = None):
        """``fsdp.Overheads`` measured at the nearest rank count per node, or None."""
        from gnn_ptp.fsdp import Overheads

        if not self.fsdp or gpus < 2:
            return None
        per_node = gpus // self.nodes_for(gpus, nodes)
        key = min(self.fsdp, key=lambda k: (abs(math.log2(int(k)) - math.log2(per_node)), -int(k)))
        d = self.fsdp[key]
        fresh = d.get("fresh") or {}
        return Overheads(d["unit_forward_ms"], d["unit_backward_ms"], d["optimizer_tensor_ms"],
                         fresh.get("threshold_bytes"), fresh.get("ms_per_MiB", 0.0))

    def nodes_for(self, gpus: int, nodes: int | None = None) -> int:
        if nodes is None:
            return max(1, math.ceil(gpus / self.gpus_per_node))
        if nodes < 1:
            raise UserError(f"--nodes must be at least 1, got {nodes}")
        if gpus % nodes:
            raise UserError(f"--gpus {gpus} does not split evenly over --nodes {nodes}")
        if gpus // nodes > self.gpus_per_node:
            raise UserError(f"--gpus {gpus} on --nodes {nodes} is {gpus // nodes} per node; interconnect "
                            f"{self.name} has {self.gpus_per_node} per node")
        return nodes

    def level(self, gpus: int, nodes: int | None = None) -> Fabric:
        given = nodes
        nodes = self.nodes_for(gpus, nodes)
        fits = self.intra if nodes == 1 else self.inter
        if not fits:
            asked = f"--gpus {gpus}" + (f" --nodes {given}" if given is not None else "")
            if nodes > 1:
                raise UserError(f"{asked}: interconnect {self.name} has no multi-node level (one node of "
                                f"{self.gpus_per_node} ranks): allowed --gpus 1 to {self.gpus_per_node} on one "
                                "node with it; for more give --interconnect a multi-node profile "
                                "(e.g. h100-ib-ndr400) or a gnn-ptp calibrate-comm file")
            raise UserError(f"{asked}: interconnect {self.name} has no single-node level; give --nodes "
                            "or --interconnect a profile measured inside one node")
        return min(fits, key=lambda f: (abs(math.log2(f.measured_gpus) - math.log2(max(gpus, 1))),
                                        -f.measured_gpus))

    def allreduce(self, message_bytes: float, gpus: int, nodes: int | None = None) -> AllReduceTime:
        given, nodes = nodes, self.nodes_for(gpus, nodes)
        if gpus == 1:
            return AllReduceTime(message_bytes, 1, 1, 0.0, math.inf, math.inf, "none", "", self.name, True)
        fabric = self.level(gpus, given)
        t_us = fabric.allreduce_us(message_bytes, gpus)
        algbw = message_bytes / (t_us * 1e3) if t_us > 0 else math.inf
        algorithm = fabric.algorithm if fabric.split_bytes is None else \
            f"{fabric.algorithm}: {fabric.line_name(message_bytes, gpus)}"
        return AllReduceTime(message_bytes, gpus, nodes, t_us, algbw, algbw * 2 * (gpus - 1) / gpus,
                             algorithm, fabric.name, self.name, fabric.is_measured(gpus))

    def collective_us(self, kind: str, message_bytes: float, gpus: int, nodes: int | None = None) \
            -> tuple[float, bool]:
        """(time, measured) of one all-gather or reduce-scatter whose unsharded tensor is ``message_bytes``
        over ``gpus`` ranks: at a measured world size and inside the measured sizes, interpolated between
        this collective's own measured rows; else from its fitted lines (the nearest world size's); both
        measured True. Where the profile has neither, derived from the all-reduce line (see
        ``collectives``; measured False)."""
        if kind not in COLLECTIVES[1:]:
            raise ValueError(f"kind is {kind!r}: one of {', '.join(COLLECTIVES[1:])}")
        if gpus <= 1 or message_bytes <= 0:
            return 0.0, True
        given, nodes = nodes, self.nodes_for(gpus, nodes)
        level = "intra" if nodes == 1 else "inter"
        rows = sorted((r["message_bytes"], r["time_us"]) for r in self.measurements
                      if r.get("collective") == kind and r["gpus"] == gpus and r.get("level", "intra") == level)
        if len(rows) >= 2 and rows[0][0] <= message_bytes <= rows[-1][0]:
            return _interpolate(rows, message_bytes), True
        fits = self.collectives.get(kind, {}).get(level, ())
        if fits:
            fit = min(fits, key=lambda f: (abs(math.log2(f.measured_gpus) - math.log2(gpus)), -f.measured_gpus))
            if len(rows) >= 2 and message_bytes > rows[-1][0]:  # beyond the largest measured size: continue
                # from it along the line's slope (the line alone can sit below the last row: not monotone)
                top, top_us = rows[-1]
                return top_us + max(0.0, fit.allreduce_us(message_bytes, gpus) - fit.allreduce_us(top, gpus)), True
            return fit.allreduce_us(message_bytes, gpus), True
        from gnn_ptp.fsdp import collective_us

        return collective_us(self.level(gpus, given), kind, message_bytes, gpus), False

    def compute_slowdown(self, gpus: int, nodes: int | None = None) -> float:
        """How much slower each rank computes because ranks share a node's compute (CPUs only)."""
        per_node = gpus // self.nodes_for(gpus, nodes)
        if str(per_node) in self.node_sharing:
            return max(1.0, self.node_sharing[str(per_node)]["compute_slowdown"])
        if self.compute_slots is None:
            return 1.0
        return max(1.0, per_node / self.compute_slots)

    def bucket_copy_ms(self, grad_bytes: float, gpus: int, nodes: int | None = None) -> float:
        """DDP's copies of every gradient into its bucket and back (``gradient_as_bucket_view=False``),
        where the profile measured a copy bandwidth (CPU ranks: the copies run on the compute thread).
        0 for GPU profiles: at HBM speed they are a few hundredths of a millisecond per 100 MB."""
        if gpus == 1:
            return 0.0
        per_node = gpus // self.nodes_for(gpus, nodes)
        sharing = self.node_sharing.get(str(per_node))
        if not sharing or not sharing.get("copy_GBps"):
            return 0.0
        return 2 * grad_bytes / (sharing["copy_GBps"] * 1e6)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["schema"] = SCHEMA
        d["intra"] = [f.to_dict() for f in self.intra]
        d["inter"] = [f.to_dict() for f in self.inter]
        d["collectives"] = {kind: {level: [f.to_dict() for f in fits] for level, fits in levels.items()}
                            for kind, levels in self.collectives.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Interconnect":
        d = dict(d)
        if d.pop("schema", None) != SCHEMA:
            raise ValueError(f"interconnect schema is not {SCHEMA}")
        d["intra"] = tuple(Fabric.from_dict(f) for f in d["intra"])
        d["inter"] = tuple(Fabric.from_dict(f) for f in d.get("inter", ()))
        d["hardware"] = tuple(d.get("hardware", ()))
        d["measurements"] = tuple(d.get("measurements", ()))
        d["collectives"] = {kind: {level: tuple(Fabric.from_dict(f) for f in fits) for level, fits in levels.items()}
                            for kind, levels in d.get("collectives", {}).items()}
        unknown = set(d["collectives"]) - set(COLLECTIVES[1:])
        if unknown:
            raise ValueError(f"unknown collectives {sorted(unknown)}: allowed {', '.join(COLLECTIVES[1:])}")
        return cls(**d)


def _interpolate(rows: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear in log-log between the measured (size, time) rows around ``x`` (inside their range):
    a measured world size answers from its own table, where caches make the time far from one line."""
    for (x0, y0), (x1, y1) in zip(rows, rows[1:]):
        if x0 <= x <= x1:
            if x1 == x0:
                return y0
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    raise ValueError(f"{x} is outside the measured sizes {rows[0][0]} .. {rows[-1][0]}")


def builtin() -> dict[str, Interconnect]:
    """The profiles shipped with gnn-ptp."""
    from gnn_ptp.comm import load_measurements

    f = fabrics()
    rows = tuple({k: r[k] for k in ("gpus", "message_bytes", "time_us")} for r in load_measurements())
    out = {
        "h100-nvswitch": Interconnect(
            "h100-nvswitch", "one node of 8 H100 SXM, NVLink4 / NVSwitch (DGX / HGX H100)", GPUS_PER_NODE,
            (f["nvlink"],), hardware=("h100", "h200"), source=f["nvlink"].source,
            measurements=tuple(r for r in rows if r["gpus"] == f["nvlink"].measured_gpus)),
        "h100-ib-ndr400": Interconnect(
            "h100-ib-ndr400", "nodes of 8 H100 SXM, NVLink4 inside, 8x NDR400 InfiniBand between",
            GPUS_PER_NODE, (f["nvlink"],), (f["infiniband"],), hardware=("h100", "h200"),
            source=f["infiniband"].source, measurements=rows),
    }
    folder = resources.files("gnn_ptp").joinpath(PACKAGED_DIR)
    if folder.is_dir():
        for item in sorted(folder.iterdir(), key=lambda p: p.name):
            if item.name.endswith(".json"):
                profile = Interconnect.from_dict(json.loads(item.read_text()))
                out[profile.name] = profile
    return out


def load(name_or_file: str) -> Interconnect:
    """A shipped profile by name, or a profile file written by ``gnn-ptp calibrate-comm``."""
    profiles = builtin()
    if name_or_file in profiles:
        return profiles[name_or_file]
    path = Path(name_or_file)
    if path.suffix == ".json" or path.exists():
        try:
            return Interconnect.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            raise UserError(f"--interconnect {name_or_file}: no such file") from None
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"--interconnect {name_or_file}: not an interconnect profile written by "
                            f"gnn-ptp calibrate-comm ({type(e).__name__}: {e})") from None
    raise UserError(f"--interconnect {name_or_file!r}: not a profile file; shipped profiles are "
                    f"{', '.join(profiles)}")


def default_for(hardware: str, gpus: int, nodes: int | None = None) -> Interconnect | None:
    """The shipped profile for a hardware target: H100/H200 use NVSwitch on one node and InfiniBand
    beyond; a CPU uses its calibrated gloo profile. None where there is none."""
    profiles = builtin()
    if hardware in ("h100", "h200"):
        one_node = (nodes or math.ceil(gpus / GPUS_PER_NODE)) == 1
        return profiles["h100-nvswitch" if one_node else "h100-ib-ndr400"]
    for p in profiles.values():
        if hardware in p.hardware:
            return p
    return None


def write(profile: Interconnect, path: Path) -> None:
    from gnn_ptp.store import atomic_write_text

    atomic_write_text(json.dumps(profile.to_dict(), indent=1) + "\n", path)
