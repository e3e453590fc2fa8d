"""``gnn-ptp train``: fit the GNN on a dataset folder, holding whole model families out.

Targets are log milliseconds of the forward, backward and optimizer phases (and their sum, the step),
and log peak bytes where measured. The loss is a Huber loss in log space, i.e. on relative error.
Splits are by family, seeded; training stops early when the validation families stop improving, and
the best epoch's weights are kept. Every epoch prints one line.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gnn_ptp import checkpoint, dataset, metrics, node_labels
from gnn_ptp.errors import UserError, closest
from gnn_ptp.model import ModelConfig, StepTimeGNN, log_total

HUBER_DELTA = 0.1  # in log space: relative errors above ~10% are penalised linearly
CORRECTION_SCALES = (0.0, 0.25, 0.5, 0.75, 1.0)
"""The factors on a residual model's learnt log-correction to the prior that ``scale_on_validation`` chooses
among (``StepTimeGNN.correction_scale``): 0 answers with the prior alone, 1 with the correction as learnt.
Declared before any run scored it (README *Protocol*, "The correction's scale")."""


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lr: float = 2e-3
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    batch_size: int = 16
    """Graphs per training batch."""
    epochs: int = 300
    patience: int = 40
    """Stop after this many epochs without a better validation MAPE."""
    seed: int = 0
    test_families: tuple[str, ...] | None = None
    """Families held out for evaluation; None draws test_fraction of them with the seed."""
    val_families: tuple[str, ...] | None = None
    """Families for early stopping; None draws val_fraction of them with the seed."""
    test_fraction: float = 0.2
    val_fraction: float = 0.15
    memory_weight: float = 0.5
    """Weight of the peak-memory loss next to the time loss."""
    threads: int | None = None
    """torch CPU threads for training (None: torch's default)."""
    node_weight: float = 0.0
    """Weight of the node-level loss next to the phase loss: Huber on each profiled node's log time, weighted
    by its measured share of its phase (gnn_ptp/node_labels.py; needs readout node_sum). 0: phase totals
    only, as before node labels existed."""
    labels: str = "mean"
    """What a configuration measured more than once is labelled by (``dataset.LABEL_STATS``): ``mean``, the
    mean of its records, or ``fastest``, its fastest record (the uncontended step, for hosts whose
    interference only slows steps down). The checkpoint carries it; ``evaluate`` scores it on the same."""
    scale_on_validation: bool = False
    """With [model] target "log_ratio_prior": after training, scale the learnt correction to the prior by the
    one of ``CORRECTION_SCALES`` with the lowest step MAPE on the validation families (the smaller on a tie),
    so that a correction that does not carry to unseen families is shrunk towards the prior it corrects;
    the checkpoint carries the factor and every factor's validation and test MAPE. False: the correction as
    learnt (factor 1)."""
    correction_scale: float | None = None
    """With [model] target "log_ratio_prior": a fixed factor (0 to 1) on the learnt correction to the prior,
    set from outside the training run, e.g. the factor the evaluation protocol's leave-one-family-out chose
    for this kind (``protocol.LOFO_SCALED``: each family's factor chosen on the other families' folds); the
    checkpoint carries it with every factor's validation and test MAPE, as ``scale_on_validation`` does.
    None: no fixed factor. Not with ``scale_on_validation``."""
    scale_beyond_range: bool = False
    """With [model] target "log_ratio_prior": a second factor on the correction, for steps larger than every
    training step (``StepTimeGNN.beyond_scale``): the one of ``CORRECTION_SCALES`` with the lowest step MAPE,
    on the training steps with at least ``model.BEYOND_FACTOR`` times the FLOPs of the smaller half's largest,
    of a second model of the same config trained on that smaller half (``choose_beyond_scale``), so that a
    correction that does not carry to larger steps is shrunk there, and one that does is kept. The checkpoint
    carries the factor and the training maximum. Declared before any run scored it (README *Protocol*, "A
    factor for larger steps")."""
    beyond_scale: float | None = None
    """With [model] target "log_ratio_prior": a fixed factor (0 to 1) for steps larger than every training step,
    set in the config instead of chosen by ``scale_beyond_range`` (which it excludes): the correction's factor
    moves, linearly in log FLOPs, from the in-range one at the largest training step to this one at
    ``model.BEYOND_FACTOR`` times its FLOPs and beyond; at 0 such steps are priced by the prior alone. The
    checkpoint carries it and the training maximum. None: no factor for larger steps. Declared before it was
    scored (README *Protocol*, "Fresh steps for the size protocol")."""
    ensemble_seeds: tuple[int, ...] | None = None
    """Two seeds or more: train one model per seed (each its own initialisation, batches and, unless
    ``val_families`` names them, validation families drawn by its seed; each its own factor with
    ``scale_on_validation``) on the same test families (those of ``seed``), and answer at the geometric mean of
    their step times (``model.SeedEnsemble``). None: one model, trained with ``seed``."""

    def __post_init__(self):
        for name in ("batch_size", "epochs", "patience", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise UserError(f"training config: {name} = {value!r} must be an integer")
        checks = {"lr": self.lr > 0, "batch_size": self.batch_size >= 1, "epochs": self.epochs >= 1,
                  "patience": self.patience >= 1, "weight_decay": self.weight_decay >= 0,
                  "test_fraction": 0 <= self.test_fraction < 1, "val_fraction": 0 <= self.val_fraction < 1,
                  "memory_weight": self.memory_weight >= 0,
                  "node_weight": isinstance(self.node_weight, (int, float)) and 0 <= self.node_weight < math.inf,
                  "test_fraction + val_fraction": self.test_fraction + self.val_fraction < 1}
        for name, ok in checks.items():
            if not ok:
                value = getattr(self, name, None) if "+" not in name else self.test_fraction + self.val_fraction
                raise UserError(f"training config: {name} = {value!r} is out of range")
        if self.labels not in dataset.LABEL_STATS:
            raise UserError(f"training config: labels = {self.labels!r}; allowed: {', '.join(dataset.LABEL_STATS)}")
        if not isinstance(self.scale_on_validation, bool):
            raise UserError(f"training config: scale_on_validation = {self.scale_on_validation!r} must be true "
                            "or false")
        if self.scale_on_validation and self.model.target != "log_ratio_prior":
            raise UserError("training config: scale_on_validation = true scales a correction to the physical prior: "
                            f"it needs [model] target = \"log_ratio_prior\", not {self.model.target!r}")
        if self.correction_scale is not None:
            self._check_factor("correction_scale", "the prior alone", "the correction as learnt",
                               "scale_on_validation" if self.scale_on_validation else None, "on the correction")
        if not isinstance(self.scale_beyond_range, bool):
            raise UserError(f"training config: scale_beyond_range = {self.scale_beyond_range!r} must be true or false")
        if self.scale_beyond_range and self.model.target != "log_ratio_prior":
            raise UserError("training config: scale_beyond_range = true scales a correction to the physical prior: it "
                            f"needs [model] target = \"log_ratio_prior\", not {self.model.target!r}")
        if self.beyond_scale is not None:
            self._check_factor("beyond_scale", "the prior alone beyond the training range",
                               "the in-range correction carried on",
                               "scale_beyond_range" if self.scale_beyond_range else None, "for larger steps")
        if self.ensemble_seeds is not None:
            seeds = self.ensemble_seeds
            if (not isinstance(seeds, tuple) or len(seeds) < 2 or len(set(seeds)) != len(seeds)
                    or any(not isinstance(x, int) or isinstance(x, bool) for x in seeds)):
                raise UserError(f"training config: ensemble_seeds = {list(seeds) if isinstance(seeds, tuple) else seeds!r} "
                                "must be two different integer seeds or more, e.g. [0, 1, 2]")
        if self.node_weight and self.model.readout != "node_sum":
            raise UserError(f"training config: node_weight = {self.node_weight!r} needs per-node shares of the "
                            f"phase times: [model] readout = \"node_sum\", not {self.model.readout!r} (a queue "
                            "readout's node times are device times, which the node labels are not)")

    def _check_factor(self, name: str, low: str, high: str, conflict: str | None, what: str) -> None:
        """One clear line unless the fixed factor ``name`` is a number from 0 (``low``) to 1 (``high``) on a
        residual model, with no ``conflict`` option also setting the factor ``what``."""
        factor = getattr(self, name)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 <= factor <= 1:
            raise UserError(f"training config: {name} = {factor!r} must be a number from 0 ({low}) to 1 ({high})")
        if self.model.target != "log_ratio_prior":
            raise UserError(f"training config: {name} scales a correction to the physical prior: it needs [model] "
                            f"target = \"log_ratio_prior\", not {self.model.target!r}")
        if conflict:
            raise UserError(f"training config: {name} = {factor!r} and {conflict} = true both set the factor {what}; "
                            "keep one")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        model = d.pop("model", {}) or {}
        if not isinstance(model, dict):
            raise UserError(f"training config: 'model' must be a [model] table, not {model!r}")
        model = ModelConfig(**_checked(model, ModelConfig, "[model]"))
        d = _checked(d, cls, "training config")
        if isinstance(d.get("ensemble_seeds"), list):
            d["ensemble_seeds"] = tuple(d["ensemble_seeds"])
        for key in ("test_families", "val_families"):
            if isinstance(d.get(key), str):
                d[key] = (d[key],)  # test_families = "gpt2" means one family, not four letters
            elif d.get(key) is not None:
                d[key] = tuple(d[key])
        return cls(model=model, **d)


def _checked(d: dict, cls, where: str) -> dict:
    names = {f.name for f in dataclasses.fields(cls)} - {"model"}
    for key in d:
        if key not in names:
            raise UserError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(names))}"
                            + closest(key, names))
    return d


def load_train_config(path: str | Path | None) -> TrainConfig:
    if path is None:
        return TrainConfig()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"training config {str(path)!r} does not exist")
    try:
        return TrainConfig.from_dict(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"training config {path}: {e}") from None
    except TypeError as e:
        raise UserError(f"training config {path}: {e}") from None


class TrainingDiverged(UserError):
    """No epoch produced a finite validation error (NaN losses): the config's fault (learning rate),
    reported as one line; a sweep marks such a trial failed and goes on."""


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@torch.no_grad()
def predict_samples(model: StepTimeGNN, samples: list, batch_size: int = 32) -> dict[str, np.ndarray]:
    """Predicted and measured ms per phase and in total, and predicted log memory, in sample order."""
    from torch_geometric.loader import DataLoader

    model.eval()
    pred, true, mem = [], [], []
    for batch in DataLoader(samples, batch_size=batch_size, shuffle=False):
        out = model(batch)
        lp = out["log_phase_ms"]
        pred.append(torch.cat([lp, log_total(lp)[:, None]], dim=1).exp())
        true.append(batch.y.exp())
        mem.append(out["log_memory"])
    return {"pred_ms": torch.cat(pred).numpy(), "true_ms": torch.cat(true).numpy(),
            "pred_log_memory": torch.cat(mem).numpy()}


def _loss(model: StepTimeGNN, batch, memory_weight: float, node_weight: float = 0.0) -> torch.Tensor:
    out = model(batch)
    lp = out["log_phase_ms"]
    huber = torch.nn.functional.huber_loss
    loss = huber(lp, batch.y[:, :3], delta=HUBER_DELTA) + huber(log_total(lp), batch.y[:, 3], delta=HUBER_DELTA)
    known = ~torch.isnan(batch.mem)
    if memory_weight and known.any():
        loss = loss + memory_weight * huber(out["log_memory"][known], batch.mem[known], delta=HUBER_DELTA)
    if node_weight:
        nodes = node_labels.node_loss(out["log_node_ms"], batch, HUBER_DELTA)
        if nodes is not None:
            loss = loss + node_weight * nodes
    return loss


def _step_mape(model, samples) -> float:
    p = predict_samples(model, samples)
    return float(metrics.ape(p["pred_ms"][:, 3], p["true_ms"][:, 3]).mean())


def mape_by_scale(model: StepTimeGNN, samples: list) -> dict[float, float]:
    """Step MAPE on ``samples`` at each factor of ``CORRECTION_SCALES`` on ``model``'s correction to the
    prior; ``model.correction_scale`` is left as it was."""
    kept, mapes = model.correction_scale, {}
    for scale in CORRECTION_SCALES:
        model.correction_scale = float(scale)
        mapes[float(scale)] = _step_mape(model, samples)
    model.correction_scale = kept
    return mapes


def choose_correction_scale(model: StepTimeGNN, val: list) -> tuple[float, dict]:
    """The factor on ``model``'s correction to the prior with the lowest step MAPE on ``val`` (the smaller
    factor on a tie: the nearer the prior), and each factor's MAPE there (``mape_by_scale``). Leaves
    ``model.correction_scale`` at the chosen factor."""
    mapes = mape_by_scale(model, val)
    model.correction_scale = min(mapes, key=lambda k: (mapes[k], k))
    return model.correction_scale, mapes


MIN_BEYOND_CHECK = 10
"""Check steps ``inner_size_split`` needs at least (fewer: ``scale_beyond_range`` refuses, in one line)."""


def inner_size_split(steps: list) -> tuple[list, list]:
    """The training steps' smaller half by FLOPs (to train on) and those with at least ``BEYOND_FACTOR`` times
    the FLOPs of its largest (to check on): the size protocol's split (``protocol.size_split``) inside a
    training set, at the gap its range allows."""
    from gnn_ptp.model import BEYOND_FACTOR
    from gnn_ptp.protocol import step_flops

    order = sorted(steps, key=step_flops)
    half = order[:len(order) // 2]
    check = [s for s in order if half and step_flops(s) >= BEYOND_FACTOR * step_flops(half[-1])]
    if len(check) < MIN_BEYOND_CHECK:
        raise UserError(f"scale_beyond_range needs {MIN_BEYOND_CHECK} training steps or more with "
                        f"{BEYOND_FACTOR:g}x the FLOPs of the smaller half's largest; these {len(steps)} have "
                        f"{len(check)}: their sizes span too narrow a range (set scale_beyond_range = false)")
    return half, check


def choose_beyond_scale(cfg: "TrainConfig", parts: dict, measured, log) -> dict:
    """``scale_beyond_range``'s factor: a model of ``cfg`` trained on the smaller half of ``parts["train"]`` by
    FLOPs (``inner_size_split``; early stopping on ``parts["val"]``), and the factor of ``CORRECTION_SCALES`` on
    its correction with the lowest step MAPE on the larger training steps (the smaller factor on a tie).
    Returns its record: chosen, the check's MAPE by factor, the sizes."""
    from gnn_ptp.protocol import step_flops

    half, check = inner_size_split(parts["train"])
    inner = dataclasses.replace(cfg, scale_beyond_range=False, scale_on_validation=False, correction_scale=None,
                                ensemble_seeds=None)
    start = time.perf_counter()
    log(f"factor for larger steps: a model on the {len(half)} smaller training steps, checked on the {len(check)} "
        f"with >= {step_flops(check[0]) / step_flops(half[-1]):.1f}x their largest's FLOPs")
    run = train(inner, None, None, log=lambda _: None,
                prepared=(measured, half + parts["val"], {}, {"train": half, "val": parts["val"], "test": []}))
    mapes = mape_by_scale(run["model"], check)
    chosen = min(mapes, key=lambda k: (mapes[k], k))
    log("factor for larger steps: " + ", ".join(f"{k:g} {v:.2f}%" for k, v in mapes.items())
        + f" -> {chosen:g}  ({time.perf_counter() - start:.0f} s)")
    return {"chosen": chosen, "check_mape": {f"{k:g}": v for k, v in mapes.items()}, "n_inner_train": len(half),
            "n_check": len(check), "inner_max_flops": step_flops(half[-1]),
            "train_max_flops": max(step_flops(s) for s in parts["train"]), "inner_best_epoch": run["best_epoch"],
            "train_s": round(time.perf_counter() - start, 1)}


def trust_boundary(samples: list, by_category: bool = False) -> torch.Tensor:
    """Where ``trust_region`` fades a correction: the longest kernel of ``samples`` by the prior's device
    time (log ms), or with ``by_category`` the longest of each op category (``ops.CATEGORIES``; -inf for a
    category none of them holds: no trusted correction there)."""
    if not by_category:
        return torch.tensor(float(max(s.prior_device_log_ms.max() for s in samples)))
    from gnn_ptp import ops

    out = torch.full((len(ops.CATEGORIES),), -math.inf)
    for s in samples:
        out.scatter_reduce_(0, s.x_cat[:, 1], s.prior_device_log_ms.float(), reduce="amax")
    return out


def train_ranges(samples: list) -> dict:
    """What the training graphs looked like: graph-feature ranges and the ops seen (for OOD checks)."""
    u = torch.cat([s.u for s in samples])
    ops_seen = torch.unique(torch.cat([s.x_cat[:, 0] for s in samples])).tolist()
    nodes = [s.num_nodes for s in samples]
    return {"u_min": u.min(0).values.tolist(), "u_max": u.max(0).values.tolist(), "op_ids": ops_seen,
            "nodes_min": min(nodes), "nodes_max": max(nodes)}


def prepare(data_dir, cfg: TrainConfig, log, strict: bool = False):
    if isinstance(data_dir, (list, tuple)):  # several hardware folders, told apart by their descriptors
        from gnn_ptp.protocol import prepare_many

        return prepare_many(data_dir, cfg, log, strict)
    measured = dataset.measured_configs(data_dir, strict=strict, label=cfg.labels)
    if cfg.labels != "mean":
        log(f"labels: each configuration's {cfg.labels} record")
    graphs = dataset.load_graphs(data_dir, measured, cfg.model.precision_aware, log=log)
    samples = dataset.make_samples(measured, graphs)
    if cfg.model.needs_hardware:
        from gnn_ptp import descriptor

        descriptor.attach_measured(samples, measured)
    if not samples:
        raise UserError(f"none of the {len(measured)} configurations in {data_dir} could be traced; "
                        "see the skipped lines above")
    if cfg.node_weight and cfg.model.precision_aware:
        n = node_labels.attach(samples, node_labels.load(data_dir, measured, log=log))
        log(f"node labels: {n} of {len(samples)} configurations have profiled nodes")
    split = dataset.family_split([s.family for s in samples], cfg.seed, cfg.test_families, cfg.val_families,
                                 cfg.test_fraction, cfg.val_fraction)
    parts = {name: [s for s in samples if split[s.family] == name] for name in ("train", "val", "test")}
    return measured, samples, split, parts


def train(cfg: TrainConfig, data_dir: str | Path, out: str | Path | None, logger=None, log=None,
          on_epoch=None, prepared=None, strict: bool = False) -> dict:
    """Train; save a checkpoint to ``out`` (if given). ``on_epoch(epoch, val_mape)`` may raise to stop
    (Optuna pruning). ``prepared`` is ``prepare(...)``'s result, for callers that train many times on
    the same data (sweeps). Returns the run's summary (metrics, split, paths)."""
    from torch_geometric.loader import DataLoader

    log = log or (lambda msg: print(msg, file=sys.stderr))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    measured, samples, split, parts = prepared or prepare(data_dir, cfg, log, strict)
    if cfg.ensemble_seeds:
        return _train_ensemble(cfg, data_dir, out, logger, log, (measured, samples, split, parts))
    if not parts["train"] or not parts["val"]:
        raise UserError(f"need train and validation families; split: {split}")
    hardware = measured[0].hardware
    log(f"{len(samples)} graphs: {len(parts['train'])} train, {len(parts['val'])} val, "
        f"{len(parts['test'])} test; held out: test {sorted(f for f, s in split.items() if s == 'test')}, "
        f"val {sorted(f for f, s in split.items() if s == 'val')}")

    seed_everything(cfg.seed)
    model = StepTimeGNN(cfg.model)
    train_y = torch.cat([s.y for s in parts["train"]])
    log_nodes = float(np.mean([math.log(max(1, int((s.phase == p).sum()))) for s in parts["train"]
                               for p in range(3)]))
    mems = torch.cat([s.mem for s in parts["train"]])
    mem_mean = float(mems[~torch.isnan(mems)].mean()) if (~torch.isnan(mems)).any() else 0.0
    model.set_offsets(float(train_y[:, :3].mean()), log_nodes, mem_mean)
    if cfg.model.needs_hardware:
        from gnn_ptp import descriptor

        model.descriptor = descriptor.of_samples(parts["train"])
        if cfg.model.trust_region:  # the longest training kernel (of each op category), by the prior's device time
            model.trust_log_ms.copy_(trust_boundary(parts["train"], cfg.model.trust_by_category))
        if cfg.model.readout == "queue":  # start at the prior's own kernel times and host costs
            model.time_offset.fill_(0.0)
        elif cfg.model.target == "log_ratio_prior":  # start at the prior times the data's mean ratio to it
            model.time_offset.fill_(descriptor.mean_log_ratio(parts["train"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs, eta_min=cfg.lr * 0.05)
    generator = torch.Generator().manual_seed(cfg.seed)
    loader = DataLoader(parts["train"], batch_size=cfg.batch_size, shuffle=True, generator=generator)

    best = {"val_mape": math.inf, "epoch": -1, "state": None}
    start = time.perf_counter()
    for epoch in range(1, cfg.epochs + 1):
        tick = time.perf_counter()
        model.train()
        total, count = 0.0, 0
        for batch in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = _loss(model, batch, cfg.memory_weight, cfg.node_weight if cfg.model.precision_aware else 0.0)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            total += float(loss.detach()) * batch.num_graphs
            count += batch.num_graphs
        scheduler.step()
        train_mape = _step_mape(model, parts["train"])
        val_mape = _step_mape(model, parts["val"])
        improved = val_mape < best["val_mape"]
        if improved:
            best = {"val_mape": val_mape, "epoch": epoch,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        log(f"epoch {epoch:4d}  loss {total / count:.4f}  train MAPE {train_mape:6.2f}%  "
            f"val MAPE {val_mape:6.2f}%{' *' if improved else '  '}  {time.perf_counter() - tick:5.1f} s")
        if logger:
            logger.log({"epoch": epoch, "loss": total / count, "train_mape": train_mape, "val_mape": val_mape})
        if on_epoch:
            on_epoch(epoch, val_mape)
        if epoch - best["epoch"] >= cfg.patience:
            log(f"early stop: no better validation MAPE for {cfg.patience} epochs")
            break
    if best["state"] is None:
        raise TrainingDiverged(f"training diverged: no epoch gave a finite validation MAPE (last: {val_mape}); "
                               "lower the learning rate")
    model.load_state_dict(best["state"])
    train_s = time.perf_counter() - start
    scaling = None
    if cfg.scale_on_validation or cfg.correction_scale is not None:
        if cfg.scale_on_validation:
            chosen, val_mapes = choose_correction_scale(model, parts["val"])
            said = (" (validation MAPE by factor: "
                    + ", ".join(f"{k:g} {v:.2f}%" for k, v in val_mapes.items()) + ")")
        else:
            val_mapes = mape_by_scale(model, parts["val"]) if parts["val"] else {}
            model.correction_scale = chosen = float(cfg.correction_scale)
            said = ", the training config's fixed factor"
        # every factor's figure on the held-out families, for the record: not chosen on
        test_mapes = mape_by_scale(model, parts["test"]) if parts["test"] else {}
        scaling = {"chosen": chosen, "chosen_by": "validation" if cfg.scale_on_validation else "config",
                   "val_mape": {f"{k:g}": v for k, v in val_mapes.items()},
                   "test_mape": {f"{k:g}": v for k, v in test_mapes.items()}}
        log(f"correction to the prior scaled by {chosen:g}{said}")
    beyond = None
    if cfg.scale_beyond_range:
        beyond = choose_beyond_scale(cfg, parts, measured, log)
    elif cfg.beyond_scale is not None:
        from gnn_ptp.protocol import step_flops

        beyond = {"chosen": float(cfg.beyond_scale), "chosen_by": "config",
                  "train_max_flops": max(step_flops(s) for s in parts["train"])}
        log(f"factor for larger steps {beyond['chosen']:g}, the training config's, beyond "
            f"{beyond['train_max_flops']:.3g} FLOPs")
    if beyond:
        model.beyond_scale, model.train_max_flops = beyond["chosen"], beyond["train_max_flops"]

    result_metrics = {}
    for name, part in parts.items():
        if part:
            p = predict_samples(model, part)
            result_metrics[name] = metrics.report(p["pred_ms"][:, 3], p["true_ms"][:, 3],
                                                  [s.precision for s in part], [s.family for s in part])
    summary = {
        "best_epoch": best["epoch"], "val_mape": best["val_mape"], "train_s": round(train_s, 1),
        "metrics": result_metrics, "split": split, "n_samples": len(samples),
        "data_hash": dataset.data_hash(measured), "hardware": hardware,
        **({"correction_scale": scaling} if scaling else {}),
        **({"beyond_scale": beyond} if beyond else {}),
    }
    log(f"best epoch {best['epoch']}: val MAPE {best['val_mape']:.2f}%"
        + (f", test MAPE {result_metrics['test']['overall']['mape']:.2f}%" if "test" in result_metrics else "")
        + f"  ({train_s:.0f} s)")
    if logger:
        logger.summary({"best_epoch": best["epoch"], "val_mape": best["val_mape"],
                        **({"test_mape": result_metrics["test"]["overall"]["mape"]}
                           if "test" in result_metrics else {})})
    if out is not None:
        _save(cfg, model, data_dir, out, parts["train"], parts["train"] + parts["val"], parts, summary, log)
    summary["model"] = model
    return summary


def _save(cfg: TrainConfig, model, data_dir, out, trained: list, seen: list, parts: dict, summary: dict,
          log) -> None:
    """Write the checkpoint (``model.pt`` + ``meta.json``, ``summary`` in it) and the ridge baseline of
    ``evaluate``, fitted once here on ``parts``' graphs. ``trained``: the graphs the model's ranges are
    those of; ``seen``: those of every hardware kind it knows."""
    import torch_geometric

    from gnn_ptp.graph import feature_version
    from gnn_ptp.records import now_utc

    hardware = summary["hardware"]
    over_prior = checkpoint.prior_calibration(model)
    meta = {
        "model": cfg.model.to_dict(), "train": cfg.to_dict(), "feature_version": feature_version(dataset.trace_target(hardware)),
        "hardware": hardware, "trace_target": dataset.trace_target(hardware),
        "data_dir": str(data_dir), "created": now_utc(), "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__, "train_ranges": train_ranges(trained),
        **({"hardware_descriptor": model.descriptor.to_dict(),
            "hardware_kinds": sorted({s.hardware_name for s in seen})}
           if model.descriptor is not None else {}),
        **({"prior_calibration": over_prior} if over_prior else {}),
        **summary,
    }
    summary["checkpoint"] = str(checkpoint.save(model, meta, out))
    if cfg.model.precision_aware:
        from gnn_ptp.baselines import GraphTotalsRidge, save_ridge

        save_ridge(GraphTotalsRidge().fit(parts["train"], parts["val"]), summary["data_hash"], out)
    log(f"checkpoint written to {out}")


def _train_ensemble(cfg: TrainConfig, data_dir, out, logger, log, prepared) -> dict:
    """``train`` with ``cfg.ensemble_seeds``: one model per seed on the test families of ``cfg.seed``'s split,
    each with its own validation families (drawn by its seed unless the config names them), combined into a
    ``SeedEnsemble``. The checkpoint's split: the test families, a family ``val`` if every member validated
    on it, else ``train``; each member's own split, epoch, validation MAPE and factor are in
    ``meta["ensemble"]``. The ridge baseline is fitted on the first member's split."""
    from gnn_ptp.model import SeedEnsemble

    measured, samples, split, parts = prepared
    test = tuple(sorted(f for f, role in split.items() if role == "test"))
    families = [s.family for s in samples]
    members, runs, first_parts = [], [], None
    start = time.perf_counter()
    for i, seed in enumerate(cfg.ensemble_seeds):
        mine = dataclasses.replace(cfg, seed=seed, ensemble_seeds=None, test_families=test)
        own = dataset.family_split(families, seed, test, cfg.val_families, cfg.test_fraction, cfg.val_fraction)
        own_parts = {name: [s for s in samples if own[s.family] == name] for name in ("train", "val", "test")}
        log(f"ensemble member {i + 1} of {len(cfg.ensemble_seeds)}: seed {seed}")
        run = train(mine, data_dir, None, logger=None, log=log, prepared=(measured, samples, own, own_parts))
        members.append(run.pop("model"))
        runs.append((seed, own, run))
        first_parts = first_parts or own_parts
    model = SeedEnsemble(members).eval()
    train_s = time.perf_counter() - start
    roles = {f: "test" if f in test else "val" if all(own[f] == "val" for _, own, _ in runs) else "train"
             for f in split}
    result_metrics = {}
    if parts["test"]:
        p = predict_samples(model, parts["test"])
        result_metrics["test"] = metrics.report(p["pred_ms"][:, 3], p["true_ms"][:, 3],
                                                [s.precision for s in parts["test"]],
                                                [s.family for s in parts["test"]])
    ensemble = {"seeds": list(cfg.ensemble_seeds), "members": [
        {"seed": seed, "val_families": sorted(f for f, role in own.items() if role == "val"),
         "best_epoch": run["best_epoch"], "val_mape": run["val_mape"], "train_s": run["train_s"],
         **({"correction_scale": run["correction_scale"]} if "correction_scale" in run else {}),
         **({"beyond_scale": run["beyond_scale"]} if "beyond_scale" in run else {}),
         **({"test_mape": run["metrics"]["test"]["overall"]["mape"]} if "test" in run["metrics"] else {})}
        for seed, own, run in runs]}
    summary = {"best_epoch": None, "val_mape": None, "train_s": round(train_s, 1), "metrics": result_metrics,
               "split": roles, "n_samples": len(samples), "data_hash": dataset.data_hash(measured),
               "hardware": measured[0].hardware, "ensemble": ensemble}
    log(f"ensemble of {len(members)}: "
        + (f"test MAPE {result_metrics['test']['overall']['mape']:.2f}% (members "
           + ", ".join(f"{m['test_mape']:.2f}%" for m in ensemble["members"]) + ")" if result_metrics else "no test families")
        + f"  ({train_s:.0f} s)")
    if logger:
        logger.summary({"ensemble": len(members), **({"test_mape": result_metrics["test"]["overall"]["mape"]}
                                                      if result_metrics else {})})
    if out is not None:
        trained = [s for s in samples if any(own[s.family] == "train" for _, own, _ in runs)]
        seen = [s for s in samples if roles[s.family] != "test"]
        _save(cfg, model, data_dir, out, trained, seen, first_parts, summary, log)
    summary["model"] = model
    return summary
