"""The collector's settings (``gnn-ptp collect``), in a module of their own without torch, so that building
the command line parser (every command, ``--help`` and each refusal) does not import torch."""

from __future__ import annotations

from dataclasses import dataclass

from gnn_ptp.errors import UserError


@dataclass
class CollectConfig:
    grid: str
    """Grid file (TOML) listing the configurations to measure."""
    out: str
    """Dataset folder, named for the hardware (datasets/h100, datasets/cpu)."""
    device: str = "auto"
    """cuda, cpu or auto (cuda when present)."""
    warmup_steps: int = 3
    min_steps: int = 10
    """Timed steps: at least this many..."""
    min_time_s: float = 1.0
    """...and at least this long..."""
    overhead_target: float = 0.2
    """...and long enough that building and warm-up stay under this share of the wall time..."""
    max_time_s: float = 30.0
    """...but never longer than this (or max_steps)."""
    max_steps: int = 1000
    budget_s: float | None = None
    """Stop cleanly before starting a configuration that would not finish within this many seconds."""
    retry_errors: bool = False
    repeat: bool = False
    """Measure again configurations the folder already holds (and only those): run-to-run noise."""
    limit: int | None = None
    """Measure at most this many configurations in this run."""
    threads: int | None = None
    """CPU threads for torch (CPU collection only)."""
    ddp: bool = False
    parallel: str = "ddp"
    """Under --ddp: ddp (DistributedDataParallel), fsdp (FSDP2 fully_shard per block, resharded after the
    forward) or fsdp-no-reshard (parameters kept gathered from forward to backward, ZeRO-2-like)."""
    bucket_cap_mb: float = 25.0
    allow_dir_mismatch: bool = False
    """Write even if the folder's name is not the hardware's label (h100 data into datasets/h200...)."""
    mode: str = "auto"
    """harvest (one model per shape, all precision classes swept over it, time-bounded timing, per-op
    profiles), classic (one model per record, timed until build and warm-up are under overhead_target),
    or auto: harvest, except under --ddp."""
    harvest_steps: int = 20
    """Harvest: timed steps per record, at most..."""
    harvest_time_s: float = 0.3
    """...or as many as fit in about this many seconds (from the warm-up's step time)..."""
    harvest_min_steps: int = 5
    """...but at least this many."""
    profile: str = "sample"
    """Harvest: one extra profiled step per record (all), for a sample covering every family x precision
    class within profile_share of the wall time (sample), or none."""
    profile_share: float = 0.2
    """Largest share of the harvest's wall time that profiling may take (sample)."""

    def __post_init__(self):
        for name in ("warmup_steps", "min_steps", "max_steps"):
            if getattr(self, name) < 0:
                raise UserError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.overhead_target < 1:
            raise UserError(f"--overhead-target must be between 0 and 1, got {self.overhead_target}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise UserError(f"--device must be auto, cuda or cpu, got {self.device!r}")
        if self.mode not in ("auto", "harvest", "classic"):
            raise UserError(f"--mode must be auto, harvest or classic, got {self.mode!r}")
        if self.parallel not in ("ddp", "fsdp", "fsdp-no-reshard"):
            raise UserError(f"--parallel must be ddp, fsdp or fsdp-no-reshard, got {self.parallel!r}")
        if self.parallel != "ddp" and not self.ddp:
            raise UserError(f"--parallel {self.parallel} measures several processes: run under torchrun with --ddp")
        if self.mode == "harvest" and self.ddp:
            raise UserError("--mode harvest measures one process; --ddp runs the classic loop (--mode classic)")
        if self.profile not in ("sample", "all", "none"):
            raise UserError(f"--profile must be sample, all or none, got {self.profile!r}")
        if not 0 <= self.profile_share < 1:
            raise UserError(f"--profile-share must be in [0, 1), got {self.profile_share}")
        if self.harvest_min_steps < 1 or self.harvest_steps < self.harvest_min_steps:
            raise UserError(f"--harvest-steps ({self.harvest_steps}) must be >= --harvest-min-steps "
                            f"({self.harvest_min_steps}) >= 1")
        if self.harvest_time_s <= 0:
            raise UserError(f"--harvest-time-s must be > 0, got {self.harvest_time_s}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise UserError(f"--budget-s must be > 0, got {self.budget_s}")

    @property
    def harvest(self) -> bool:
        return self.mode == "harvest" or (self.mode == "auto" and not self.ddp)
