"""Leaving a torch.distributed process group (gloo or NCCL) without aborting a rank."""

from __future__ import annotations


def leave_together() -> None:
    """Tear the process group down after a barrier, and after collecting the garbage that may still hold
    DDP reducers or FSDP2 modules and their pending work: a rank destroying gloo while another is still in
    a call, or an object outliving the group it works on, aborts the process at exit ('terminate called
    without an active exception'). Does nothing where no group is initialised."""
    import gc

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    gc.collect()
    try:
        dist.barrier()
    except Exception:  # noqa: BLE001 - a rank already gone: tear down regardless
        pass
    dist.destroy_process_group()
