"""``gnn-ptp sweep``: an Optuna search over the GNN's architecture and training hyperparameters.

Each trial trains on the same family split (the base config's seed) and scores its best validation
MAPE; a MedianPruner stops trials whose validation error lags the other trials' at the same epoch.
The study lives in a database: a local SQLite file by default, or a shared server
(``--storage postgresql://...``) so that workers on several machines add trials to one study; give each
worker its own ``--seed``, or workers that start together propose the same first trials.
``--write-best`` turns the best trial into a training config for ``gnn-ptp train --config``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings
from pathlib import Path

from gnn_ptp.errors import UserError
from gnn_ptp.model import LAYERS, NORMS, READOUTS
from gnn_ptp.train import TrainConfig

HIDDEN = (32, 64, 128, 256)
HEADS = (1, 2, 4, 8)  # every HIDDEN is divisible by every HEADS
BATCH_SIZES = (8, 16, 32, 64)
WARMUP_EPOCHS = 10
"""Epochs a trial always runs before it may be pruned."""
STARTUP_TRIALS = 5
"""Completed trials needed before the pruner compares against them."""
INSTALL_HINT = {"optuna": "pip install 'optuna>=4.0'",
                "psycopg2": "pip install 'gnn-ptp[postgres]' (or: pip install psycopg2-binary)"}


def require(module: str):
    """Import an optional dependency now that it is needed; a missing one is one line with the fix."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"gnn-ptp sweep needs {module} ({e}); install it with: "
                        f"{INSTALL_HINT[module]}") from None


def storage_url(storage: str | Path | None, data_dir: str | Path) -> str:
    """The study's database URL: a URL as given (``postgresql://`` gets the driver that is installed), any
    other value a SQLite file path; None is ``DATA/.cache/sweep.db``."""
    if storage is not None and "://" in str(storage):
        return _with_driver(str(storage))
    path = Path(storage) if storage is not None else Path(data_dir) / ".cache" / "sweep.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.resolve()}"


def _with_driver(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy 2.0 and psycopg 3 to 2.1: name whichever is here."""
    import importlib.util

    scheme, rest = url.split("://", 1)
    if scheme not in ("postgresql", "postgres"):
        return url
    for module in ("psycopg", "psycopg2"):
        if importlib.util.find_spec(module):
            return f"postgresql+{module}://{rest}"
    raise UserError(f"a PostgreSQL study needs a driver; install it with: {INSTALL_HINT['psycopg2']}")


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1] if "@" in url else url


def open_study(url: str, study_name: str, seed: int, pruner=None):
    """Create the study, or join it when it exists (other workers may be running it)."""
    optuna = require("optuna")
    import sqlalchemy.exc

    try:
        storage = _rdb_storage(optuna, url)
        return optuna.create_study(
            storage=storage, study_name=study_name, direction="minimize", load_if_exists=True,
            sampler=optuna.samplers.TPESampler(seed=seed, constant_liar=True),
            pruner=pruner or optuna.pruners.MedianPruner(n_startup_trials=STARTUP_TRIALS,
                                                         n_warmup_steps=WARMUP_EPOCHS))
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.OperationalError, ImportError) as e:
        reason = str(e).strip().splitlines()[0]  # ImportError: Optuna's "install the DB access module"
        raise UserError(f"cannot open the study database {_safe(url)}: {reason}") from None


def _rdb_storage(optuna, url: str, attempts: int = 5):
    """Optuna's database storage, with heartbeats: a trial whose worker died (a killed machine) is marked
    failed instead of running forever. Workers that start together on an empty database race to create
    Optuna's tables (the loser gets a duplicate-type or duplicate-table error): wait and look again."""
    import sqlalchemy.exc

    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna and say so each time
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, heartbeat_interval=60, grace_period=180)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def readouts_for(base: TrainConfig) -> tuple[str, ...]:
    """The readouts a sweep may draw on top of ``base``: node labels (``node_weight``) need node_sum's
    shares; ``queue`` corrects the prior's kernels, so only a residual over the prior can use it; a
    ``trust_region`` needs per-node corrections (not pool)."""
    if base.node_weight:
        return ("node_sum",)
    allowed = list(READOUTS)
    if base.model.target != "log_ratio_prior":
        allowed.remove("queue")
    if base.model.trust_region:
        allowed.remove("pool")
    return tuple(allowed)


def suggest_config(trial, base: TrainConfig, epochs: int | None) -> TrainConfig:
    """The trial's point of the search space, on top of the base config (split, seed, memory weight...)."""
    layer = trial.suggest_categorical("layer", LAYERS)
    model = dataclasses.replace(
        base.model, layer=layer,
        hidden=trial.suggest_categorical("hidden", HIDDEN),
        depth=trial.suggest_int("depth", 1, 6),
        norm=trial.suggest_categorical("norm", NORMS),
        readout=trial.suggest_categorical("readout", readouts_for(base)),
        dropout=trial.suggest_float("dropout", 0.0, 0.3),
        heads=trial.suggest_categorical("heads", HEADS) if layer != "gine" else base.model.heads)
    return dataclasses.replace(
        base, model=model,
        lr=trial.suggest_float("lr", 1e-4, 1e-2, log=True),
        weight_decay=trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
        batch_size=trial.suggest_categorical("batch_size", BATCH_SIZES),
        epochs=epochs or base.epochs)


def sweep(data_dir: str | Path, trials: int, storage: str | Path | None = None, study_name: str = "gnn-ptp",
          out_config: str | Path | None = None, epochs: int | None = None, seed: int = 0, log=None,
          base: TrainConfig | None = None, pruner=None):
    """Run ``trials`` trials in this process (other workers may add theirs to the same study); write
    the study's best trial as a training config to ``out_config`` (if given). Returns the study.

    ``epochs`` overrides the base config's epochs for every trial; ``seed`` seeds the sampler (the
    training seed, hence the split, is the base config's); ``pruner`` replaces the MedianPruner."""
    if trials < 1:
        raise UserError(f"trials = {trials} must be at least 1")
    optuna = require("optuna")
    from gnn_ptp.train import TrainingDiverged, prepare, train

    log = log or print
    base = base or TrainConfig()
    if base.ensemble_seeds:
        raise UserError(f"--config: ensemble_seeds = {list(base.ensemble_seeds)}: a sweep scores each trial's one "
                        "model on its validation families; drop ensemble_seeds from the sweep's base config (an "
                        "ensemble's members choose their own validation families)")
    prepared = prepare(data_dir, base, log)  # once: fails early on bad data; every trial reuses it
    _, samples, split, parts = prepared
    if not parts["train"] or not parts["val"]:
        raise UserError(f"need train and validation families; split: {split}")
    log(f"{len(samples)} graphs: {len(parts['train'])} train, {len(parts['val'])} val (families "
        f"{', '.join(sorted(f for f, s in split.items() if s == 'val'))}), {len(parts['test'])} test")
    url = storage_url(storage, data_dir)
    study = open_study(url, study_name, seed, pruner)
    log(f"study {study_name!r} in {_safe(url)}: {len(study.trials)} trials so far; running {trials} more")
    started: dict[int, float] = {}

    def objective(trial) -> float:
        started[trial.number] = time.perf_counter()
        cfg = suggest_config(trial, base, epochs)
        trial.set_user_attr("config", cfg.to_dict())
        best = math.inf

        def on_epoch(epoch: int, val_mape: float) -> None:
            nonlocal best
            best = min(best, val_mape)
            trial.set_user_attr("epochs_run", epoch)
            trial.report(best, epoch)  # best so far, as the objective scores it: one bad epoch prunes nothing
            if trial.should_prune():
                raise optuna.TrialPruned(f"val MAPE {best:.2f}% at epoch {epoch}")

        result = train(cfg, data_dir, None, log=lambda msg: None, on_epoch=on_epoch, prepared=prepared)
        trial.set_user_attr("best_epoch", result["best_epoch"])
        return result["val_mape"]

    def on_trial_done(study, trial) -> None:
        seconds = time.perf_counter() - started.pop(trial.number, time.perf_counter())
        log(trial_line(study, trial, seconds))

    interrupted = False
    try:
        study.optimize(objective, n_trials=trials, callbacks=[on_trial_done], gc_after_trial=True,
                       catch=(TrainingDiverged,))  # a diverged trial fails; the worker goes on
    except KeyboardInterrupt:
        interrupted = True  # still write the best so far, then stop as asked
    if out_config is not None and not (interrupted and not _completed(study)):
        path = write_best(study, out_config)
        best = best_trial(study)
        log(f"best trial {best.number} (val MAPE {best.value:.2f}%) written to {path}")
    if interrupted:
        raise KeyboardInterrupt
    return study


def _completed(study) -> list:
    import optuna

    return [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]


def trial_line(study, trial, seconds: float) -> str:
    state = trial.state.name.lower()
    epochs = trial.user_attrs.get("epochs_run", 0)
    if state == "complete":
        what = f"val MAPE {trial.value:6.2f}%  ({epochs} epochs)"
    elif state == "pruned":
        last = trial.intermediate_values.get(epochs, math.nan)
        what = f"pruned at epoch {epochs}  (val MAPE {last:.2f}%)"
    else:
        what = state
    done = _completed(study)
    best = min(done, key=lambda t: t.value) if done else None
    best_text = f"best {best.value:.2f}% (trial {best.number})" if best else "none complete yet"
    params = " ".join(f"{k}={_fmt(v)}" for k, v in trial.params.items())
    return f"trial {trial.number:3d}  {what}  {seconds:5.1f} s  {best_text}  {params}"


def _fmt(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def best_trial(study):
    """The study's best completed trial, from every worker."""
    done = _completed(study)
    if not done:
        raise UserError(f"study {study.study_name!r} has no completed trial yet: no best config to write")
    best = min(done, key=lambda t: t.value)
    if "config" not in best.user_attrs:
        raise UserError(f"trial {best.number} of study {study.study_name!r} holds no training config "
                        "(it was not run by gnn-ptp sweep)")
    return best


def best_config(study) -> TrainConfig:
    return TrainConfig.from_dict(best_trial(study).user_attrs["config"])


def write_best(study, path: str | Path) -> Path:
    """Write the best completed trial's training config as TOML (``gnn-ptp train --config`` reads it)."""
    from gnn_ptp.store import atomic_write_text

    best = best_trial(study)
    cfg = TrainConfig.from_dict(best.user_attrs["config"])
    header = (f"# Best trial {best.number} of Optuna study {study.study_name!r}: val MAPE {best.value:.2f}%.\n"
              f"# Written by gnn-ptp sweep; epochs = {cfg.epochs} was the sweep's budget per trial "
              "(gnn-ptp train --epochs overrides it).\n")
    path = Path(path)
    atomic_write_text(header + to_toml(cfg.to_dict()), path)
    return path


def to_toml(d: dict) -> str:
    """TOML for a training config dict: top-level values, then one table per nested dict; None is left
    out (every None field defaults to None)."""
    top = [f"{k} = {_toml_value(v)}" for k, v in d.items() if v is not None and not isinstance(v, dict)]
    tables = [f"\n[{k}]\n" + "".join(f"{kk} = {_toml_value(vv)}\n" for kk, vv in v.items() if vv is not None)
              for k, v in d.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n" + "".join(tables)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")

