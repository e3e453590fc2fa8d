"""Experiment logging: Weights & Biases when asked for (imported only then), nothing otherwise.

``WANDB_MODE=offline`` logs to ./wandb without any network; ``wandb sync`` uploads it later.
"""

from __future__ import annotations

from gnn_ptp.errors import UserError


class WandbLogger:
    def __init__(self, config: dict, project: str = "gnn-ptp", name: str | None = None,
                 tags: list[str] | None = None, dir: str | None = None):
        try:
            import wandb
        except ImportError:
            raise UserError("--wandb needs the wandb package: pip install wandb") from None
        self.wandb = wandb
        self.run = wandb.init(project=project, name=name, config=config, tags=tags, dir=dir,
                              reinit="finish_previous")

    def log(self, values: dict) -> None:
        self.run.log(values)

    def summary(self, values: dict) -> None:
        for key, value in values.items():
            self.run.summary[key] = value

    def finish(self) -> None:
        self.run.finish()
