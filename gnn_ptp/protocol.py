"""``gnn-ptp evaluate --protocol lofo|size|hardware``: an evaluation protocol that trains its own models.

One held-out split (``gnn-ptp evaluate``) says little: three families, a wide interval. The protocol
retrains from scratch for every fold and scores every predictor on the same held-out configurations:

- ``lofo``: leave one family out, for every family (or ``--families``): train on the rest (a few of them,
  drawn with the seed, for early stopping), test on the one left out. Mean and worst family MAPE.
- ``size``: train on the smaller half of the configurations by FLOPs, test on those at least 4x larger
  than the largest training one (size extrapolation; validation: 15 % of the training half, seeded).
- ``hardware``: train on one hardware kind (by descriptor: a CPU model, a GPU kind), test on another,
  every ordered pair, and with three kinds or more also on all the other kinds together, testing on the
  one left out (``--hardware-folds``); needs datasets of two kinds or more (several ``--data`` folders).

``lofo`` and ``size`` over several kinds' folders train one model on all of them (told apart by their
descriptors, as ``train`` with several folders does; a family left out is left out of every kind) and score
each kind alone besides (``by_kind``).

Predictors: each GNN variant (``gnn``: the training config as given; ``gnn-prior``: the same predicting
the log-ratio to the physical prior, with the hardware descriptor fed in), the ridge regression on graph
totals (``gnn_ptp/baselines.py``, fitted on the same training and validation configurations) and the
prior alone. A GPU's or a CPU's prior is fitted to that hardware's own profiled kernels and steps
(``prior_fit``), so the shipped one has seen most families: on such data (a folder with per-op profiles)
every fold refits it to its training and validation configurations only (``PriorRefit``), before the
residual GNN is trained over it, so that neither has seen a step of the configurations it is scored on.
In the ``hardware`` protocol a kind only tested on is priced by the fold's fit moved by the measured
ceilings (``descriptor.transfer``; of several training kinds, the one with the nearest ceilings), or,
where nothing in the fold can be refitted and the shipped prior has seen the test kind's steps, by curves
fitted to kernel timings alone (``FALLBACK_SECTION``). Every MAPE comes with a bootstrap 95 % interval
(families and configurations resampled) and the label noise floor of the same configurations: the error
a perfect predictor of the true mean would show against labels that average n noisy measurements,
sqrt(2/pi) x the measurements' relative standard deviation / sqrt(n), that deviation pooled from the
configurations measured more than once nearest in step time (``noise.py``), so the ones measured once
count with their full noise.

Training many models takes time: ``--epochs``, ``--patience``, ``--families`` and ``--seeds`` set the
budget, ``--jobs`` trains that many folds at once in forked processes (CI runs it all on synthetic data in
seconds). Every fold's per-configuration predictions are kept in the result (``folds[].pred_ms``).
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gnn_ptp import dataset, metrics, prior_fit
from gnn_ptp.descriptor import CPU_TRANSFER
from gnn_ptp.errors import UserError, closest

PROTOCOLS = ("lofo", "size", "hardware")
VARIANTS = ("gnn", "gnn-prior")
HARDWARE_FOLDS = ("pairs", "rest", "all")
HARDWARE_TRANSFERS = ("nearest", "mean")
TRANSFER_MODES = ("ceilings", "split", "sized")
"""``descriptor.TRANSFER_MODES``, spelled here so that a budget is checked without importing it."""
SIZE_FACTOR = 4.0
"""``size``: test configurations have at least this many times the FLOPs of the largest training one."""
TARGETS = {"lofo_mean_mape": 8.0, "lofo_worst_mape": 15.0, "size_mape": 12.0, "hardware_mape": 15.0,
           "ridge_ratio": 1.5}
"""The issue's targets (MAPE in %; the GNN's MAPE at least ridge_ratio times lower than the ridge's)."""


@dataclass(frozen=True)
class Budget:
    """How much training the protocol may spend."""

    epochs: int | None = None
    """Epochs per model (None: the training config's)."""
    patience: int | None = None
    """Early-stopping patience (None: the config's, capped at epochs)."""
    families: tuple[str, ...] | None = None
    """lofo: hold out only these families (all of them train the other folds); None: every family."""
    seeds: tuple[int, ...] = (0,)
    """Each seed retrains every model (split of validation families, initialisation, batches)."""
    variants: tuple[str, ...] = VARIANTS
    threads: int | None = None
    """torch threads for training (None: torch's default)."""
    bootstrap: int = 2000
    """Bootstrap resamples for the 95 % intervals."""
    refit_prior: bool = True
    """Refit a GPU's prior in every fold (where the data has per-op profiles); False scores the shipped
    prior (faster, but it has seen the held-out families' steps)."""
    hardware_folds: str = "all"
    """hardware: ``pairs`` (train on each kind, test on each other kind), ``rest`` (train on all the other
    kinds together, test on the one left out: a checkpoint of every kind held asked about a new one) or
    ``all`` (both; with two kinds the two are the same folds)."""
    hardware_test: str | None = None
    """hardware: only the folds that test on this kind (a descriptor name, e.g. a new CPU kind scored once
    against the others: ``rest`` then trains one fold instead of one per kind); None: every fold."""
    hardware_transfer: str = "nearest"
    """hardware: a kind tested on is priced by the nearest training kind's prior (``nearest``) or the
    geometric mean of every training kind's (``mean``), moved by the ceilings (``PriorRefit.transfer``)."""
    transfer_mode: str = CPU_TRANSFER
    """hardware: how a CPU kind's prior moves to another CPU kind (``descriptor.transfer``'s mode, by default
    ``descriptor.CPU_TRANSFER``: ``sized`` since 2026-12-07, each kernel by the step probes at its size where
    both kinds measured them, else ``split``, only a kernel's time at the ceilings by them and the rest by the
    non-GEMM ratio (the default from 2026-11-26); ``ceilings``, every peak by the ceilings' ratio)."""
    depthwise_law: bool = True
    """A CPU kind's prior refitted in every fold prices depthwise convolutions by a power law in their
    shape (``prior_fit.fit(depthwise=True)``, ``PriorRefit.depthwise_law``; since 2026-11-26: each family
    left out on the first CPU kind, the residual GNN 19.9 -> 13.8 %, README *The CPU prior*)."""
    slow_conv_law: tuple[str, ...] = ()
    """Dtypes whose dense convolutions the CPU prior refitted in every fold prices by the additive shape law
    (``prior_fit.fit_slow_conv``: per call, per multiply-add, per weight element per sample, per im2col and
    per input/output element; ``prior.Profile.slow_conv``) on top of its section's options, for a kind whose
    shipped section lacks it (the fourth kind's carries it for bf16). Empty (default): the section's."""
    profiler_cost: bool = False
    """A CPU kind's prior refitted in every fold reads node seconds less the profiler's cost per recorded op
    (``node_labels.profiler_cost_us``) on top of its section's options, for a kind whose shipped section
    lacks it. False (default): the section's."""
    depthwise_floor: bool = False
    """A CPU kind's prior refitted in every fold never prices a depthwise-like convolution faster than the
    fastest one its law was fitted to (``prior_fit.fit_depthwise_floor``, ``prior.Profile.depthwise_floor``)
    on top of its section's options. False (default): the section's."""
    attention_law: bool = False
    """A CPU kind's prior refitted in every fold prices fused attention by a law in the costs of its kernel's
    loops (``prior_fit.fit_attention``, ``prior.Profile.attention``) on top of its section's options. False
    (default): the section's."""
    depthwise_paths: bool = False
    """A CPU kind's prior refitted in every fold prices depthwise convolutions by a law per kernel path
    (``prior_fit.fit_depthwise_paths``, ``prior.Profile.depthwise_paths``) on top of its section's options.
    False (default): the section's."""
    conv_blocks: bool = False
    """A CPU kind's prior refitted in every fold prices its dense convolutions' law with a cost per weight
    element per call and one per multiply-add of a convolution whose channels are not in whole blocks
    (``prior_fit.fit_slow_conv(conv_blocks=True)``, ``prior.CONV_CHANNEL_BLOCK``) on top of its section's
    options (where the section or ``slow_conv_law`` gives it that law). False (default): the section's."""
    matmul_cap: bool = False
    """A CPU kind's prior refitted in every fold holds each matmul curve at most at the fastest fraction of its
    ceiling it gives a kernel of the fold's training steps (``prior_fit.fit_device(matmul_cap=True)``,
    ``prior.Curve.fraction_max``) on top of its section's options. False (default): the section's."""
    depthwise_stride: bool = False
    """A CPU kind's prior refitted in every fold has the stride among its depthwise law's terms
    (``prior_fit.fit_depthwise(stride=True)``) on top of its section's options, for a kind whose shipped
    section's law lacks it. False (default): the section's."""
    refit_as_shipped: bool = True
    """The prior refitted in every fold uses the curve options its hardware's shipped section was fitted
    with (``prior_fit.section_options``: pooled or per-category vector and bandwidth curves, the batch
    norms' channel ramp), so that the protocol scores the prior that ships; False: ``fit_device``'s
    defaults (per-category, no ramp), the form before the eighteenth session (2026-11-26)."""
    labels: str | None = None
    """How a configuration measured more than once is labelled (``dataset.LABEL_STATS``): the mean of its
    records or its fastest record (``fastest``: on a shared VM whose interference only slows steps down;
    README *Protocol*, labels from the fastest record). None (default): the training config's ``labels``
    (mean unless it says), so that the protocol scores what ``train`` with that config ships. The noise
    floor follows (``noise.floor_for``)."""
    jobs: int = 1
    """Folds trained at once, each in a forked worker process (``threads`` torch threads each, 1 when
    unset): a leave-one-family-out run is 17 independent folds per seed. Same results as one at a time."""

    def __post_init__(self):
        for name in ("epochs", "patience"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise UserError(f"protocol budget: {name} = {value!r} must be a positive integer")
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise UserError(f"protocol variants {list(unknown) or '(none)'}: allowed: {', '.join(VARIANTS)}"
                            + (closest(unknown[0], VARIANTS) if unknown else ""))
        if not self.seeds:
            raise UserError("protocol needs at least one seed")
        bad = [d for d in self.slow_conv_law if d not in SLOW_CONV_DTYPES]
        if bad:
            raise UserError(f"protocol slow_conv_law dtype {bad[0]!r}: allowed: {', '.join(SLOW_CONV_DTYPES)}"
                            + closest(bad[0], SLOW_CONV_DTYPES))
        for name, allowed in (("hardware_folds", HARDWARE_FOLDS), ("hardware_transfer", HARDWARE_TRANSFERS),
                              ("transfer_mode", TRANSFER_MODES), ("labels", dataset.LABEL_STATS)):
            value = getattr(self, name)
            if value not in allowed and not (name == "labels" and value is None):
                raise UserError(f"protocol {name.replace('_', ' ')} {value!r}: allowed: {', '.join(allowed)}"
                                + closest(str(value), allowed))
        if not isinstance(self.jobs, int) or self.jobs < 1:
            raise UserError(f"protocol jobs = {self.jobs!r}: must be a positive integer")


# --- data -------------------------------------------------------------------------------------------------


def load(data_dirs, precision_aware: bool = True, log=None, strict: bool = False, node_labels: bool = False,
         label: str = "mean"):
    """Samples of every folder with their hardware attached (``descriptor.attach``), the measured
    configurations, and each configuration's repeated step-time medians on its hardware (for the noise
    floor), keyed by (hardware name, configuration key): ``repeat_key(sample)``. With ``node_labels`` (a
    config with node_weight) the profiled configurations get their node labels (``node_labels.attach``),
    as ``train`` gives them: the protocol trains what ``train`` would ship. ``label``: how repeated
    configurations are labelled (``dataset.LABEL_STATS``); the repeats stay every record's step median."""
    from gnn_ptp import descriptor
    from gnn_ptp.records import iter_records, measurement_problem

    measured, samples, repeats = [], [], defaultdict(list)
    for data_dir in data_dirs:
        m = dataset.measured_configs(data_dir, strict=strict, label=label)
        s = dataset.make_samples(m, dataset.load_graphs(data_dir, m, precision_aware, log=log))
        descriptor.attach_measured(s, m)
        if node_labels and precision_aware:  # as ``train`` does for a config with node_weight
            from gnn_ptp import node_labels as labels

            n = labels.attach(s, labels.load(data_dir, m, log=log))
            if n:
                (log or print)(f"{data_dir}: node labels for {n} of {len(s)} configurations (node_weight)")
        names = sorted({x.hardware_name for x in s})
        if len(names) > 1:
            raise UserError(f"{data_dir} mixes hardware {names}; keep one folder per hardware kind")
        measured += m
        samples += s
        for r in iter_records(data_dir, warn=lambda _: None, strict=False, check=measurement_problem):
            if r.get("status") == "ok" and (r.get("ddp") or {}).get("world_size", 1) == 1:
                # one configuration's repeats on one hardware kind: kinds share configuration keys
                repeats[(names[0], r["key"])].append(float(r["timing"]["step_ms"]["median"]))
    if not samples:
        raise UserError(f"none of the configurations in {', '.join(map(str, data_dirs))} could be traced")
    return measured, samples, dict(repeats)


def refuse_mixed_targets(data_dirs, strict: bool = False) -> None:
    """One clear error, from the records alone (before any graph is traced), where several folders trace
    for different targets (CPU and GPU): one model cannot learn both."""
    targets = sorted({dataset.trace_target(m.hardware) for d in data_dirs
                      for m in dataset.measured_configs(d, strict=strict)})
    if len(targets) > 1:
        raise UserError(f"--data folders {', '.join(map(str, data_dirs))} trace for {' and '.join(targets)}: "
                        "train CPU and GPU hardware apart")


def prepare_many(data_dirs, cfg, log, strict: bool = False):
    """``train.prepare`` for several dataset folders (one per hardware kind, e.g. two CPU models): one
    checkpoint learns them all, told apart by their descriptors. Whole families go to one split on every
    hardware."""
    if not cfg.model.hardware_descriptor:
        raise UserError("training on several --data folders needs [model] hardware_descriptor = true: without "
                        "it the model cannot tell their hardware apart")
    refuse_mixed_targets(data_dirs, strict)
    measured, samples, _ = load(data_dirs, cfg.model.precision_aware, log, strict, node_labels=bool(cfg.node_weight),
                                label=cfg.labels)
    split = dataset.family_split([s.family for s in samples], cfg.seed, cfg.test_families, cfg.val_families,
                                 cfg.test_fraction, cfg.val_fraction)
    parts = {name: [s for s in samples if split[s.family] == name] for name in ("train", "val", "test")}
    return measured, samples, split, parts


def repeat_key(sample) -> tuple:
    """A sample's key into ``load``'s repeats: its hardware kind and its configuration."""
    return getattr(sample, "hardware_name", None), sample.key


def noise_floor(keys, repeats: dict, label: str = "mean") -> float | None:
    """The label noise floor (%) of these configurations (``noise.NoiseFloor``): sqrt(2/pi) x the
    per-measurement relative sd / sqrt(n), the sd pooled from the hardware's repeated configurations nearest
    in step time, so configurations measured once count with their full noise (None where the hardware has
    no configuration measured twice); for fastest-record labels the split-half error ``noise.FastestFloor``."""
    from gnn_ptp.noise import floor_for

    return floor_for(label, repeats).floor(keys)


def step_flops(sample) -> float:
    """Total FLOPs of a sample's step (``model.node_flops`` summed)."""
    from gnn_ptp.model import node_flops

    return float(node_flops(sample.x).sum())


@dataclass
class PriorRefit:
    """The per-node measured seconds of folders with per-op profiles (``node_labels.node_seconds``), by
    hardware name: what refitting their prior in a fold needs."""

    seconds: dict[str, dict]
    max_rows: int | None = prior_fit.MAX_ROWS
    """Kernel rows the device fit draws at most (as ``prior_fit.leave_one_family_out``; None: all)."""
    descriptors: dict = dataclasses.field(default_factory=dict)
    """Every hardware kind of the data (with or without profiles), by name: a CPU kind is fitted as its
    descriptor's hardware (a GPU as ``gnn_ptp/hardware.py``'s), and a kind only tested on in a fold is
    priced from them (``apply``)."""
    mode: str = "ceilings"
    """How a prior moves between CPU kinds (``descriptor.transfer``'s mode)."""
    depthwise_law: bool = True
    """A CPU kind's fit prices depthwise convolutions by a power law in their shape (``Profile.depthwise``;
    a GPU's never: not scored there)."""
    options: dict = dataclasses.field(default_factory=dict)
    """Per hardware name, ``prior_fit.fit_device``'s curve options for its refit (``prior_fit.section_options``
    of its shipped section; empty: the defaults)."""
    transfer: str = "nearest"
    """A kind only tested on, with several training kinds in the fold: priced by the prior of the one whose
    ceilings are nearest (``descriptor.ceiling_gap``), or by the geometric mean of every training kind's
    prior moved (``mean``). ``mean`` came first; on the three CPU kinds one far kind (the Intel kind's AMX
    bf16 rate, 7x the first kind's) pulled it off: README *Protocol*."""

    def apply(self, parts: dict) -> dict:
        """Fit each hardware's prior (``prior_fit.fit``: kernel curves, then host costs) to the fold's
        training and validation configurations and re-price every sample of the fold with it
        (``prior_log_ms``). A hardware kind with no training configuration in the fold (the test kind of
        ``hardware``) is priced by the fold's fit of a kind that has one, moved by their measured ceilings
        (``descriptor.transfer``); where no kind could be refitted and the shipped prior has seen the
        tested kind's steps, every such kind is priced by ``FALLBACK_SECTION``'s curves. Returns per
        hardware name what priced it: the steps fitted on and the seconds it took, the kind transferred
        from, or the section."""
        from gnn_ptp import descriptor

        fit_on = parts["train"] + parts["val"]
        trained = {s.hardware_name for s in fit_on}
        info, fitted = {}, {}
        for name in self.seconds:
            own = [s for s in fit_on if s.hardware_name == name]
            if not own:
                continue
            tick = time.perf_counter()
            fitted[name] = self.fit(name, own)
            self._price(parts, name, fitted[name])
            info[name] = {"fit_steps": len(own), "fit_s": round(time.perf_counter() - tick, 1)}
        tested = {s.hardware_name for s in parts["test"]} - trained
        for name, desc in self.descriptors.items():
            if name in fitted or not any(s.hardware_name == name for part in parts.values() for s in part):
                continue
            sources = [n for n in fitted if self.descriptors.get(n) is not None
                       and self.descriptors[n].kind == desc.kind]
            if name in tested and sources:  # the fold's own fit, moved by the measured ceilings
                if self.transfer == "nearest":  # the training kind whose ceilings are nearest
                    sources = [min(sources, key=lambda n: descriptor.ceiling_gap(self.descriptors[n], desc))]
                self._price(parts, name, *(descriptor.transfer(fitted[n], self.descriptors[n], desc, self.mode)
                                           for n in sources))
                info[name] = {"transferred_from": sources[0] if len(sources) == 1 else sources}
            elif desc.steps_fitted_on() in tested:  # the shipped prior has seen the steps under test
                section = FALLBACK_SECTION[desc.kind]
                self._price(parts, name, desc.profile(section))
                info[name] = {"section": section}
            else:  # shipped (a kind trained on without profiles); re-priced, as an earlier fold may have moved it
                self._price(parts, name, desc.profile())
        return info

    def fit(self, name: str, samples: list):
        """``name``'s prior (``prior.Profile``: kernel curves, then host costs) fitted to ``samples`` of it, as
        every fold refits it: its hardware (a CPU kind's descriptor's), its measured fresh-allocation cost,
        the depthwise law on a CPU and its section's curve options."""
        from gnn_ptp.hardware import get_hardware

        desc = self.descriptors.get(name)
        hw = desc.profile().hardware if desc is not None and desc.kind == "cpu" else get_hardware(name)
        fresh = desc.fresh() if desc is not None else None  # a CPU kind's measured page-fault cost
        return prior_fit.fit(samples, self.seconds[name], hw, max_rows=self.max_rows, fresh=fresh,
                             depthwise=self.depthwise_law and hw.kind == "cpu", **self.options.get(name, {}))[1]

    @staticmethod
    def _price(parts: dict, name: str, *profiles) -> None:
        """Price ``name``'s samples with ``profiles``: with several (a kind moved from each of a fold's
        training kinds), each node's times are their geometric mean, host costs their mean."""
        from gnn_ptp import prior

        for s in (x for part in parts.values() for x in part if x.hardware_name == name):
            views = []
            for profile in profiles:
                prior.price(s, profile)
                views.append((s.prior_log_ms, s.prior_device_log_ms, s.host_s))
            if len(views) > 1:
                s.prior_log_ms, s.prior_device_log_ms, s.host_s = (torch.stack(v).mean(0) for v in zip(*views))


SLOW_CONV_DTYPES = ("fp32", "bf16")
"""The dtypes ``Budget.slow_conv_law`` takes (the CPU steps' convolution dtypes)."""

FALLBACK_SECTION = {"cpu": "microbench-cpu", "gpu": "h100-neusight"}
"""Curves fitted to kernel timings alone (no training step), by hardware kind: the prior of a fold in
which the shipped one was fitted to the steps under test and no training kind has profiles to refit."""


CPU_REFIT_OPTIONS = {
    "profiler_cost": "node seconds less the profiler's cost per recorded op",
    "depthwise_stride": "the depthwise law has the stride among its terms",
    "depthwise_floor": "the depthwise law never prices a kernel faster than its fastest fitted one,",
    "attention_law": "fused attention priced by the costs of its kernel's loops",
    "depthwise_paths": "depthwise convolutions priced by a law per kernel path",
    "conv_blocks": "the dense convolutions' law with costs per weight element per call and per multiply-add "
                   "of channels not in whole blocks",
    "matmul_cap": "each matmul curve held at the fastest fraction of its ceiling it reaches on the fitted kernels"}
"""What ``prior_refit`` says of each option it adds to a CPU kind's refit (``Budget``'s flags of that name)."""


def prior_refit(data_dirs, log, strict: bool = False, transfer: str = "nearest",
                mode: str = "ceilings", depthwise_law: bool = True, as_shipped: bool = False,
                slow_conv_law: tuple[str, ...] = (), profiler_cost: bool = False,
                depthwise_stride: bool = False, depthwise_floor: bool = False,
                attention_law: bool = False, depthwise_paths: bool = False,
                conv_blocks: bool = False, matmul_cap: bool = False) -> PriorRefit | None:
    """``PriorRefit`` for the folders of ``data_dirs`` whose records have per-op profiles, GPU or CPU (None
    when there is none); with ``as_shipped`` each refitted with its shipped section's curve options; a CPU
    kind's dense convolutions of the ``slow_conv_law`` dtypes priced by the additive shape law besides
    (``Budget.slow_conv_law``), its node seconds less the profiler's cost with ``profiler_cost``
    (``Budget.profiler_cost``), the stride in its depthwise law with ``depthwise_stride``
    (``Budget.depthwise_stride``), a floor under that law with ``depthwise_floor`` (``Budget.depthwise_floor``),
    fused attention priced by its law with ``attention_law`` (``Budget.attention_law``), depthwise
    convolutions by their law per path with ``depthwise_paths`` (``Budget.depthwise_paths``) and the dense
    convolutions' law with its channel-block costs with ``conv_blocks`` (``Budget.conv_blocks``) and each matmul
    curve held at the fastest fraction it reaches on its fitted kernels with ``matmul_cap`` (``Budget.matmul_cap``)."""
    from gnn_ptp import descriptor, node_labels, prior

    seconds, descriptors, options = {}, {}, {}
    for d in data_dirs:
        own = dataset.measured_configs(d, strict=strict)
        desc = descriptor.for_env(own[0].env or {"hardware": own[0].hardware})
        descriptors[desc.name] = desc
        if not node_labels.profiled_ids(d):
            continue
        log(f"{d}: the {desc.name} prior is refitted in every fold to the fold's training configurations "
            "(per-op profiles; the shipped one has seen most families)")
        section = prior.calibration().get(desc.curves_section()) if as_shipped else None
        if section:
            options[desc.name] = prior_fit.section_options(section)
            log(f"{d}: refitted with the options of its shipped section {desc.curves_section()!r}: "
                f"{options[desc.name]}")
        if slow_conv_law and desc.kind == "cpu":
            own_law = options.setdefault(desc.name, {}).get("slow_conv", ())
            options[desc.name]["slow_conv"] = tuple(sorted({*own_law, *slow_conv_law}))
            log(f"{d}: dense convolutions of {', '.join(options[desc.name]['slow_conv'])} priced by the "
                "additive shape law in every fold")
        asked = {"profiler_cost": profiler_cost, "depthwise_stride": depthwise_stride,
                 "depthwise_floor": depthwise_floor, "attention_law": attention_law,
                 "depthwise_paths": depthwise_paths, "conv_blocks": conv_blocks, "matmul_cap": matmul_cap}
        for key, on in asked.items():  # each on top of the section's options, on a CPU kind only
            if on and desc.kind == "cpu":
                options.setdefault(desc.name, {})[key] = True
                log(f"{d}: {CPU_REFIT_OPTIONS[key]} in every fold")
        seconds[desc.name] = node_labels.node_seconds(
            d, own, profiler_cost=options.get(desc.name, {}).get("profiler_cost", False))
    return (PriorRefit(seconds, descriptors=descriptors, transfer=transfer, mode=mode, depthwise_law=depthwise_law,
                       options=options)
            if seconds else None)


# --- training one fold -----------------------------------------------------------------------------------


def _variant_config(base, variant: str, budget: Budget, seed: int, test, val):
    model = base.model
    beyond, fixed = base.scale_beyond_range, base.beyond_scale
    if variant == "gnn-prior":
        model = dataclasses.replace(model, target="log_ratio_prior", hardware_descriptor=True)
    else:  # the precision-aware log-time GNN: no correction to scale
        beyond, fixed = False, None
    epochs = budget.epochs or base.epochs
    patience = min(budget.patience or base.patience, epochs)
    return dataclasses.replace(base, model=model, epochs=epochs, patience=patience, seed=seed,
                               test_families=tuple(test), val_families=tuple(val),
                               threads=budget.threads or base.threads,
                               scale_on_validation=False,  # fit_predict scores the correction both ways
                               correction_scale=None, scale_beyond_range=beyond, beyond_scale=fixed)


def fit_predict(base, budget: Budget, seed: int, parts: dict, measured, log,
                refit: PriorRefit | None = None, also: list = ()) -> tuple[dict, dict]:
    """Train every variant on ``parts["train"]`` (early stopping on ``parts["val"]``) and predict the step
    ms of ``parts["test"]``, then of ``also`` (steps only priced, e.g. ``--fresh-data``'s: nothing of the
    training sees them); also the ridge and the prior (refitted to the fold first, with ``refit``).
    Returns (predictions by name, in that order, info)."""
    from gnn_ptp.baselines import GraphTotalsRidge
    from gnn_ptp.train import choose_correction_scale, predict_samples, train

    test = parts["test"] + list(also)  # what is priced
    out, info = {}, {}
    if refit is not None:
        info["prior_refit"] = refit.apply({**parts, "also": list(also)} if also else parts)
    for variant in budget.variants:
        cfg = _variant_config(base, variant, budget, seed, sorted({s.family for s in parts["test"]}),
                              sorted({s.family for s in parts["val"]}))
        split = {s.family: name for name, part in parts.items() for s in part}
        start = time.perf_counter()
        everything = [x for part in parts.values() for x in part]
        result = train(cfg, None, None, log=lambda _: None, prepared=(measured, everything, split, parts))
        model = result["model"]
        beyond = (model.beyond_scale, model.train_max_flops)
        model.beyond_scale = None  # the rows before BEYOND: without the factor for larger steps
        out[variant] = predict_samples(model, test)["pred_ms"][:, 3]
        info[variant] = {"best_epoch": result["best_epoch"], "val_mape": result["val_mape"],
                         "train_s": round(time.perf_counter() - start, 1)}
        if variant == "gnn-prior":  # what `train` with scale_on_validation ships, from the same model
            chosen, val_mapes = choose_correction_scale(model, parts["val"])
            out[SCALED] = predict_samples(model, test)["pred_ms"][:, 3]
            info[SCALED] = {"correction_scale": chosen,
                            "val_mape": {f"{k:g}": round(v, 3) for k, v in val_mapes.items()}}
            if "beyond_scale" in result:  # the scaled model with its factor for larger steps: what it ships
                model.beyond_scale, model.train_max_flops = beyond
                out[BEYOND] = predict_samples(model, test)["pred_ms"][:, 3]
                info[BEYOND] = dict(result["beyond_scale"])
    ridge = GraphTotalsRidge().fit(parts["train"], parts["val"])
    out["ridge"] = ridge.predict_ms(test)[:, 3]
    out["prior"] = np.array([float(s.prior_log_ms.double().exp().sum()) for s in test])
    if "gnn-prior" in out:
        out[HALF] = np.sqrt(out["gnn-prior"] * out["prior"])
    return out, info


HALF = "gnn-prior-half"
"""The residual GNN with its correction to the prior halved: the geometric mean of the two. Declared
before any run scored it (a fixed shrinkage, not tuned): where the GNN and the prior err independently,
half the correction keeps what the GNN learnt that generalises and halves what it learnt of the training
families alone."""


SCALED = "gnn-prior-scaled"
"""The residual GNN with its correction to the prior scaled by the factor of ``train.CORRECTION_SCALES``
with the lowest step MAPE on the fold's validation families (``train.choose_correction_scale``): what a
checkpoint trained with ``scale_on_validation`` answers. Declared before any run scored it (README
*Protocol*, "The correction's scale")."""


LOFO_SCALED = "gnn-prior-lofo-scaled"
"""The residual GNN with its correction to the prior scaled by the factor of ``train.CORRECTION_SCALES`` with
the lowest mean of families' step MAPE over the *other* families' folds of the same seed (each family scored
by its own fold's model; the smaller factor on a tie): chosen without the scored family's labels, from a
dozen or more families' evidence instead of a fold's three validation families. Its factor over all folds is
the one the protocol chooses for the kind (``lofo_scale``), the factor a training config can fix
(``TrainConfig.correction_scale``). Declared before it was scored on a run not yet seen (README *Protocol*,
"The factor across families"). The other folds' models saw the scored family in training, so the choice is
nested in the families' labels, not in the models."""


BEYOND = "gnn-prior-beyond"
"""With a config's ``scale_beyond_range``: the scaled row's model (its factor chosen on validation) with its
factor for steps beyond its training range, chosen on an inner size split of its training steps
(``train.choose_beyond_scale``; ``StepTimeGNN.beyond_scale``): what a checkpoint trained with both answers.
With a config's fixed ``beyond_scale``, the same model with that factor.
Declared before any run scored it (README *Protocol*, "A factor for larger steps")."""


ENSEMBLE = "gnn-prior-ensemble"
SCALED_ENSEMBLE = "gnn-prior-scaled-ensemble"
BEYOND_ENSEMBLE = "gnn-prior-beyond-ensemble"
ENSEMBLED = {"gnn-prior": ENSEMBLE, SCALED: SCALED_ENSEMBLE, BEYOND: BEYOND_ENSEMBLE}
"""With two seeds or more, each residual row's seed ensemble: every configuration priced at the geometric mean
of the seeds' predictions (each seed's model trained with its own validation families and, for the scaled
row, its own factor), what a checkpoint of that many members trained with those seeds answers. Declared
before any run not yet seen scored it (README *Protocol*, "A seed ensemble")."""


def ensemble_errors(folds: list, seeds, group) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """``{ensemble row: {pseudo-seed: {group: absolute percentage errors}}}`` (the shape of a protocol's
    ``errors``; the one pseudo-seed is the seeds joined by +, e.g. ``0+1``) from the folds' stored predictions
    (``pred_ms``, 4 significant digits, so a stored run re-scores to the same figures): for each group
    (``group(fold)``: the family left out, or one group) the geometric mean over ``seeds`` of each residual
    row's predictions. Empty with fewer than two seeds or no residual rows; a group whose seeds' folds test
    different configurations is refused (a bug, not a user's input). A run over several kinds' folders scores
    its ensembles over every kind pooled: its per-kind rows (``by_kind``) have none."""
    seeds = list(seeds)
    if len(seeds) < 2:
        return {}
    by_group = defaultdict(dict)
    for f in folds:
        by_group[group(f)][f["seed"]] = f
    out = {}
    for row, name in ENSEMBLED.items():
        if not all(row in f["pred_ms"] for f in folds):
            continue
        out[name] = rows = {}
        for g, by_seed in by_group.items():
            first = by_seed[seeds[0]]
            if any(by_seed[s]["keys"] != first["keys"] for s in seeds):
                raise ValueError(f"ensemble of group {g!r}: the seeds' folds test different configurations")
            logs = np.mean([np.log(np.array(by_seed[s]["pred_ms"][row], dtype=float)) for s in seeds], axis=0)
            rows[g] = metrics.ape(np.exp(logs), np.array(first["true_ms"], dtype=float))
    key = "+".join(str(s) for s in seeds)
    return {name: {key: rows} for name, rows in out.items()}


def _beyond_last(errors: dict) -> dict:
    """``errors`` with the rows of the factor for larger steps (``BEYOND`` and its ensemble) last, so that every
    other row's bootstrap draws are those of a run without them."""
    last = (BEYOND, BEYOND_ENSEMBLE)
    return {**{k: v for k, v in errors.items() if k not in last}, **{k: errors[k] for k in last if k in errors}}


def scale_across_folds(folds: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                       scales=None) -> tuple[dict[str, float], dict[float, float]]:
    """``folds[family] = (true_ms, prior_ms, residual_ms)`` of one seed's leave-one-family-out folds. Returns
    (each family's factor chosen on the other families' folds, the mean of families' MAPE at each factor
    over all of them). A factor s prices a step at prior * (residual / prior) ** s."""
    from gnn_ptp.train import CORRECTION_SCALES

    scales = tuple(float(s) for s in (scales or CORRECTION_SCALES))
    mape = {(f, s): float(metrics.ape(prior * (residual / prior) ** s, true).mean())
            for f, (true, prior, residual) in folds.items() for s in scales}

    def best(families) -> float:
        means = {s: np.mean([mape[f, s] for f in families]) for s in scales}
        return min(scales, key=lambda s: (means[s], s))

    chosen = {f: best([g for g in folds if g != f]) if len(folds) > 1 else 1.0 for f in folds}
    return chosen, {s: float(np.mean([mape[f, s] for f in folds])) for s in scales}


def _fold_record(test: list, pred: dict, true: np.ndarray, kinds: bool = False) -> dict:
    """A fold's per-configuration predictions (4 significant digits), for paired comparisons later; with
    ``kinds`` (a run over several kinds' folders, which share configuration keys) each one's kind too."""
    return {"keys": [s.key for s in test], "true_ms": [float(f"{v:.4g}") for v in true],
            "pred_ms": {p: [float(f"{v:.4g}") for v in values] for p, values in pred.items()},
            **({"hardware": [s.hardware_name for s in test]} if kinds else {})}


_FOLDS: dict = {}
"""What a forked fold worker runs: the parent sets it before the pool forks (``_map_folds``)."""


def _timed(fn, index: int, task):
    start = time.perf_counter()
    return index, fn(task), time.perf_counter() - start


def _fold_worker(index: int):
    torch.set_num_threads(_FOLDS["threads"])
    return _timed(_FOLDS["fn"], index, _FOLDS["tasks"][index])


def _map_folds(budget: Budget, fn, tasks: list, log=None):
    """(index, fn(task), seconds) of every task, in completion order: one after another, or with
    ``budget.jobs`` > 1 in that many forked processes (they share the loaded graphs copy-on-write; each
    fold's training is seeded, so the results are those of a sequential run). A process that has run
    autograd before (a notebook, a test session) cannot fork workers that train: then the folds run one
    at a time, said in ``log``."""
    done: set[int] = set()
    if budget.jobs > 1 and len(tasks) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        _FOLDS.update(fn=fn, tasks=tasks, threads=budget.threads or 1)
        try:
            with ProcessPoolExecutor(min(budget.jobs, len(tasks)),
                                     mp_context=multiprocessing.get_context("fork")) as pool:
                futures = [pool.submit(_fold_worker, i) for i in range(len(tasks))]
                for future in as_completed(futures):
                    try:
                        result = future.result()
                    except RuntimeError as e:
                        if "fork" not in str(e):
                            raise
                        for f in futures:
                            f.cancel()
                        if log:
                            log(f"--jobs {budget.jobs}: this process ran autograd before, which forked workers "
                                "cannot inherit; the remaining folds run one at a time")
                        break
                    done.add(result[0])
                    yield result
        finally:
            _FOLDS.clear()
    for i, task in enumerate(tasks):
        if i not in done:
            yield _timed(fn, i, task)


# --- scoring ---------------------------------------------------------------------------------------------


def _interval(values) -> list[float]:
    return [float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))]


def score_groups(errors: dict[int, dict[str, np.ndarray]], rng, resamples: int) -> dict:
    """errors[seed][group] = absolute percentage errors of one predictor. Mean over groups of each group's
    MAPE (averaged over seeds), the worst group, per group, with bootstrap 95 % intervals (groups and
    configurations within them resampled; the same resample for every seed)."""
    seeds = sorted(errors)
    groups = sorted(errors[seeds[0]])
    per_group = {g: float(np.mean([errors[s][g].mean() for s in seeds])) for g in groups}
    mean = float(np.mean(list(per_group.values())))
    worst = max(groups, key=per_group.get)
    boots_mean, boots_group = [], defaultdict(list)
    for _ in range(resamples):
        chosen = rng.integers(0, len(groups), len(groups))
        picks = {g: rng.integers(0, len(errors[seeds[0]][g]), len(errors[seeds[0]][g])) for g in groups}
        group_mape = {g: np.mean([errors[s][g][picks[g]].mean() for s in seeds]) for g in groups}
        boots_mean.append(np.mean([group_mape[groups[i]] for i in chosen]))
        for g in groups:
            boots_group[g].append(group_mape[g])
    pooled = np.concatenate([np.concatenate([errors[s][g] for g in groups]) for s in seeds])
    return {"mean_mape": mean, "mean_ci95": _interval(boots_mean), "worst_family": worst,
            "worst_mape": per_group[worst], "worst_ci95": _interval(boots_group[worst]),
            "pooled_mape": float(pooled.mean()),
            "per_seed_mean_mape": {str(s): float(np.mean([errors[s][g].mean() for g in groups])) for s in seeds},
            "per_group": {g: {"mape": per_group[g], "ci95": _interval(boots_group[g]),
                              "n": int(len(errors[seeds[0]][g]))} for g in groups}}


def _predictors(budget: Budget) -> list[str]:
    return [*budget.variants, *([HALF, SCALED] if "gnn-prior" in budget.variants else []), "ridge", "prior"]


# --- the protocols ----------------------------------------------------------------------------------------


def run(protocol: str, data_dirs, config=None, budget: Budget = Budget(), log=None, strict: bool = False,
        loaded=None, fresh_dir=None, seen_dirs=()) -> dict:
    """Run one protocol; ``config`` is a training config path or ``TrainConfig`` (default: defaults).
    ``fresh_dir`` (size only): a folder of new configurations each fold's models also price (``load_fresh``),
    less those also in ``seen_dirs`` (folders of configurations already seen)."""
    from gnn_ptp.train import TrainConfig, load_train_config

    if protocol not in PROTOCOLS:
        raise UserError(f"--protocol {protocol!r}: allowed: {', '.join(PROTOCOLS)}" + closest(protocol, PROTOCOLS))
    if fresh_dir is not None and protocol != "size":
        raise UserError(f"--fresh-data: only with --protocol size (new larger steps each size fold also prices), "
                        f"not {protocol}")
    log = log or (lambda msg: print(msg, file=sys.stderr))
    base = config if isinstance(config, TrainConfig) else load_train_config(config)
    if base.ensemble_seeds:
        raise UserError(f"--config: ensemble_seeds = {list(base.ensemble_seeds)}: the protocol trains one model per "
                        f"fold and seed and scores the seeds' ensemble itself ({ENSEMBLE}, {SCALED_ENSEMBLE}: "
                        "give the seeds as --seeds); drop ensemble_seeds from the config")
    if budget.labels is None:  # the config's labels: the protocol scores what train with it would ship
        budget = dataclasses.replace(budget, labels=base.labels)
    data_dirs = [data_dirs] if isinstance(data_dirs, (str, Path)) else list(data_dirs)
    if protocol == "hardware" and loaded is None:
        _check_kinds(data_dirs, strict)  # from the records alone, before any graph is traced
    elif len(data_dirs) > 1 and loaded is None:  # lofo / size: one model for every kind of the folders
        if "gnn" in budget.variants and not base.model.hardware_descriptor:
            raise UserError(f"--protocol {protocol} over several --data folders trains one model on every kind: "
                            "variant gnn needs [model] hardware_descriptor = true in --config to tell them apart "
                            "(gnn-prior always has it: --variants gnn-prior)")
        refuse_mixed_targets(data_dirs, strict)
    measured, samples, repeats = loaded or load(data_dirs, base.model.precision_aware, log, strict,
                                                node_labels=bool(base.node_weight), label=budget.labels)
    refit = (prior_refit(data_dirs, log, strict, budget.hardware_transfer, budget.transfer_mode, budget.depthwise_law,
                         budget.refit_as_shipped, budget.slow_conv_law, budget.profiler_cost,
                         budget.depthwise_stride, budget.depthwise_floor, budget.attention_law,
                         budget.depthwise_paths, budget.conv_blocks, budget.matmul_cap)
             if budget.refit_prior else None)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    if protocol == "lofo":
        result = _lofo(base, budget, measured, samples, repeats, rng, log, refit)
    elif protocol == "size":
        fresh = (load_fresh(fresh_dir, samples, base.model.precision_aware, log, strict, budget.labels, seen_dirs)
                 if fresh_dir is not None else None)
        result = _size(base, budget, measured, samples, repeats, rng, log, refit, fresh)
    else:
        result = _hardware(base, budget, measured, samples, repeats, rng, log, refit)
    result.update(node_labelled=sum(bool(getattr(s, "node_mask", torch.zeros(1)).any()) for s in samples),
                  prior_refitted=sorted(refit.seconds) if refit else [],
                  protocol=protocol, data=[str(d) for d in data_dirs], n_samples=len(samples),
                  budget=dataclasses.asdict(budget), train_config=base.to_dict(),
                  wall_s=round(time.perf_counter() - start, 1), targets=TARGETS)
    return result


def _lofo(base, budget, measured, samples, repeats, rng, log, refit=None) -> dict:
    families = sorted({s.family for s in samples})
    held = list(budget.families or families)
    unknown = sorted(set(held) - set(families))
    if unknown:
        raise UserError(f"--families {unknown}: not in the data; families: {', '.join(families)}")
    if len(families) < 3:
        raise UserError(f"lofo needs 3 families or more (train, validation, test); the data has {families}")
    errors = {p: {seed: {} for seed in budget.seeds} for p in _predictors(budget)}
    tasks = [(seed, family) for seed in budget.seeds for family in held]
    kinds = _kinds(samples)
    multi = len(kinds) > 1  # several kinds' folders: a family is left out of every kind, scored per kind too

    def one(task):
        seed, family = task
        split = dataset.family_split([s.family for s in samples], seed, test_families=[family],
                                     val_fraction=base.val_fraction)
        parts = {n: [s for s in samples if split[s.family] == n] for n in ("train", "val", "test")}
        pred, info = fit_predict(base, budget, seed, parts, measured, log, refit)
        true = np.exp(np.array([float(s.y[0, 3]) for s in parts["test"]]))
        return pred, info, true, sorted({s.family for s in parts["val"]}), _fold_record(parts["test"], pred, true, multi)

    folds = [None] * len(tasks)
    raw = defaultdict(dict)  # seed -> family -> (true, prior, residual): for the factor across folds
    for i, (pred, info, true, val, record), seconds in _map_folds(budget, one, tasks, log):
        seed, family = tasks[i]
        for p, values in pred.items():
            errors.setdefault(p, {s: {} for s in budget.seeds})[seed][family] = metrics.ape(values, true)
        folds[i] = {"seed": seed, "test": family, "n_test": len(true), "val": val, **info, **record}
        if "gnn-prior" in pred:
            raw[seed][family] = (true, pred["prior"], pred["gnn-prior"])
        log(f"lofo seed {seed} {family:<20} n {len(true):3d}  "
            + "  ".join(f"{p} {errors[p][seed][family].mean():5.1f}%" for p in errors)
            + f"  ({seconds:.0f} s)")
    lofo_scale = {}
    if raw:  # each family's factor from the other families' folds, once every fold of the seed is in
        errors[LOFO_SCALED] = {}  # last: the other rows' bootstrap draws stay those of a run without it
        by_task = {(f["seed"], f["test"]): f for f in folds}
        for seed, by_family in raw.items():
            chosen, by_factor = scale_across_folds(by_family)
            errors[LOFO_SCALED][seed] = {}
            for family, factor in chosen.items():
                true, prior_ms, residual = by_family[family]
                pred = prior_ms * (residual / prior_ms) ** factor
                errors[LOFO_SCALED][seed][family] = metrics.ape(pred, true)
                fold = by_task[seed, family]
                fold[LOFO_SCALED] = {"correction_scale": factor}
                fold["pred_ms"][LOFO_SCALED] = [float(f"{v:.4g}") for v in pred]
            whole = min(by_factor, key=lambda s: (by_factor[s], s))
            lofo_scale[str(seed)] = {"chosen": whole,
                                     "mean_mape_by_factor": {f"{k:g}": v for k, v in by_factor.items()}}
    errors = _beyond_last({**errors, **ensemble_errors(folds, budget.seeds, lambda f: f["test"])})  # last: the others' draws stay
    keys_of = {f: [repeat_key(s) for s in samples if s.family == f] for f in held}
    scores = {p: score_groups(errors[p], rng, budget.bootstrap) for p in errors}
    from gnn_ptp.noise import floor_for

    pooled = floor_for(budget.labels, repeats)  # pooled once for every family and the whole
    floors = {f: pooled.floor(keys_of[f]) for f in held}
    for p, sc in scores.items():
        for f, row in sc["per_group"].items():
            row["noise_floor"] = floors[f]
    floor = pooled.floor([k for f in held for k in keys_of[f]])
    return {"predictors": scores, "noise_floor": floor,
            "noise_floor_mean_of_families": float(np.mean([v for v in floors.values() if v is not None]))
            if any(v is not None for v in floors.values()) else None,
            "families": held, "folds": folds, "ratios": _ratios(scores, budget, "mean_mape", "worst_mape"),
            **({"lofo_scale": lofo_scale} if lofo_scale else {}),
            **({"by_kind": _by_kind(folds, kinds, repeats, budget, rng, lambda f: f["test"])} if multi else {})}


def _kinds(samples: list) -> list:
    """The hardware kinds of a run's samples, sorted (one entry, possibly None, for a one-folder run)."""
    return sorted({getattr(s, "hardware_name", None) for s in samples}, key=str)


def _by_kind(folds: list, kinds: list, repeats: dict, budget: Budget, rng, group) -> dict:
    """A run over several kinds' folders, scored on each kind alone: every predictor's rows (``score_groups``
    over ``group(fold)``: the family left out, or one group) from the folds' own predictions
    (``folds[].pred_ms``, 4 significant digits) of that kind's configurations, and the noise floor of those
    configurations. The models are the run's, trained on every kind."""
    from gnn_ptp.noise import floor_for

    pooled, out = floor_for(budget.labels, repeats), {}  # pooled once for every kind
    for kind in kinds:
        errors, keys = defaultdict(lambda: defaultdict(dict)), set()
        for f in folds:
            mask = np.array(f["hardware"]) == kind
            if not mask.any():
                continue
            true = np.array(f["true_ms"])[mask]
            keys |= {(kind, k) for k, m in zip(f["keys"], mask) if m}
            for p, values in f["pred_ms"].items():
                errors[p][f["seed"]][group(f)] = metrics.ape(np.array(values)[mask], true)
        scores = {p: score_groups(dict(errors[p]), rng, budget.bootstrap) for p in errors}
        out[str(kind)] = {"predictors": scores, "noise_floor": pooled.floor(sorted(keys)),
                          "n": len(keys), "ratios": _ratios(scores, budget, "mean_mape", "worst_mape")}
    return out


def _ratios(scores: dict, budget: Budget, *fields) -> dict:
    out = {}
    for v in [*budget.variants, *(e for e in ENSEMBLED.values() if e in scores)]:
        for f in fields:
            mine, ridge = scores[v][f], scores["ridge"][f]
            out[f"{v} {f}"] = ridge / mine if mine else None
    return out


def size_split(samples: list, seed: int, factor: float | None = None, val_fraction: float = 0.15) -> dict:
    """The smaller half by FLOPs to train (val_fraction of it drawn for validation), and every configuration
    with at least ``factor`` x the training maximum to test."""
    factor = SIZE_FACTOR if factor is None else factor
    order = sorted(samples, key=step_flops)
    half = order[:len(order) // 2]
    top = step_flops(half[-1])
    test = [s for s in order if step_flops(s) >= factor * top]
    pool = list(half)
    random.Random(seed).shuffle(pool)
    n_val = max(1, round(val_fraction * len(pool)))
    return {"train": pool[n_val:], "val": pool[:n_val], "test": test, "train_max_flops": top}


def _size(base, budget, measured, samples, repeats, rng, log, refit=None, fresh=None) -> dict:
    errors = {p: {} for p in _predictors(budget)}
    tasks = list(budget.seeds)
    kinds = _kinds(samples)
    multi = len(kinds) > 1  # several kinds' folders: scored on each kind alone besides

    def one(seed):
        parts = size_split(samples, seed, val_fraction=base.val_fraction)
        top = parts.pop("train_max_flops")
        if not parts["test"]:
            raise UserError(f"size: no configuration has {SIZE_FACTOR:g}x the FLOPs of the smaller half's "
                            f"largest ({top:.3g}); the data spans too narrow a range")
        also = fresh_tests(fresh["samples"], top) if fresh else []
        pred, info = fit_predict(base, budget, seed, parts, measured, log, refit, also)
        n = len(parts["test"])
        pred, pred_fresh = {p: v[:n] for p, v in pred.items()}, {p: v[n:] for p, v in pred.items()}
        true = np.exp(np.array([float(s.y[0, 3]) for s in parts["test"]]))
        fold = {"seed": seed, "n_train": len(parts["train"]), "n_val": len(parts["val"]),
                "n_test": len(parts["test"]), "train_max_flops": top,
                "test_min_flops": min(step_flops(s) for s in parts["test"]),
                "test_max_flops": max(step_flops(s) for s in parts["test"]),
                "test_families": sorted({s.family for s in parts["test"]}), **info,
                **_fold_record(parts["test"], pred, true, multi)}
        if also:
            true_fresh = np.exp(np.array([float(s.y[0, 3]) for s in also]))
            fold["fresh"] = {"n_test": len(also), "test_min_flops": min(step_flops(s) for s in also),
                             "test_max_flops": max(step_flops(s) for s in also),
                             **_fold_record(also, pred_fresh, true_fresh, multi)}
        return pred, true, fold, [repeat_key(s) for s in parts["test"]]

    folds = [None] * len(tasks)
    for i, (pred, true, fold, test_keys), seconds in _map_folds(budget, one, tasks, log):
        seed = tasks[i]
        for p, values in pred.items():
            errors.setdefault(p, {})[seed] = {"size": metrics.ape(values, true)}
        folds[i] = fold
        log(f"size seed {seed}: train {fold['n_train']} (<= {fold['train_max_flops']:.3g} FLOPs), "
            f"test {fold['n_test']}  " + "  ".join(f"{p} {errors[p][seed]['size'].mean():5.1f}%" for p in errors)
            + f"  ({seconds:.0f} s)")
    scores = _one_group_scores(errors, folds, budget, rng, "size")
    out = {"predictors": scores, "noise_floor": noise_floor(test_keys, repeats, budget.labels), "folds": folds,
           "size_factor": SIZE_FACTOR, "ratios": _ratios(scores, budget, "mape")}
    if multi:
        out["by_kind"] = _by_kind(folds, kinds, repeats, budget, rng, lambda f: "size")
    if fresh:  # after every other figure's bootstrap draws
        out["fresh"] = _fresh_scores(folds, budget, fresh, rng)
    return out


def _one_group_scores(errors: dict, folds: list, budget: Budget, rng, group: str) -> dict:
    """Every row's MAPE over one group of test steps (``errors[row][seed][group]``; the size split's, the fresh
    steps'), with each residual row's seed ensemble from the folds' stored predictions (``ensemble_errors``),
    bootstrap intervals (rows of the factor for larger steps drawn last) and the per-seed figures."""
    errors = _beyond_last({**errors, **ensemble_errors(folds, budget.seeds, lambda f: group)})
    scores = {}
    for p in errors:
        sc = score_groups(errors[p], rng, budget.bootstrap)
        scores[p] = {"mape": sc["mean_mape"], "ci95": sc["mean_ci95"],
                     "per_seed_mape": sc["per_seed_mean_mape"], "n": sc["per_group"][group]["n"]}
    return scores


def fresh_tests(fresh: list, top: float) -> list:
    """``--fresh-data``'s configurations a size fold tests: those with at least ``SIZE_FACTOR`` x the FLOPs of
    its largest training step (``top``)."""
    return [s for s in fresh if step_flops(s) >= SIZE_FACTOR * top]


def seen_keys(seen_dirs) -> set[str]:
    """The configuration keys of every record (any status) in ``seen_dirs`` (``--seen-data``), read from the
    records alone (nothing traced)."""
    from gnn_ptp.records import load_records

    return {r["key"] for d in seen_dirs for r in load_records(d, status=None) if isinstance(r.get("key"), str)}


def load_fresh(fresh_dir, samples: list, precision_aware: bool, log, strict: bool, label: str,
               seen_dirs=()) -> dict:
    """``--fresh-data``: the configurations of a folder measured apart, priced by every size fold's models and
    scored apart from the folds' own test steps. A configuration also in ``--data`` is not fresh: left out, said
    so (and listed in the result); so is one also in a ``seen_dirs`` folder (``--seen-data``: an earlier fresh
    set, whose steps chose forms; listed apart). Refused in one line when its kind is not among the trained
    kinds or when nothing new is left."""
    measured, fresh, repeats = load([fresh_dir], precision_aware, log, strict, label=label)
    kinds = sorted({s.hardware_name for s in samples})
    theirs = sorted({s.hardware_name for s in fresh})
    if any(k not in kinds for k in theirs):
        raise UserError(f"--fresh-data {fresh_dir}: its steps are of {', '.join(theirs)}, which no --data folder "
                        f"trains on ({', '.join(kinds)}); fresh steps must be of a kind the folds train on")
    held = {repeat_key(s) for s in samples}
    both = [s for s in fresh if repeat_key(s) in held]
    seen = seen_keys(seen_dirs)
    elsewhere = [s for s in fresh if repeat_key(s) not in held and s.key in seen]
    if len(both) + len(elsewhere) == len(fresh):
        raise UserError(f"--fresh-data {fresh_dir}: all {len(fresh)} of its configurations are also in --data"
                        + (" or --seen-data" if seen_dirs else "") + "; fresh steps must be new configurations")
    for part, where in ((both, "--data"), (elsewhere, "--seen-data")):
        if part:
            (log or print)(f"--fresh-data {fresh_dir}: {len(part)} of its {len(fresh)} configurations are also in "
                           f"{where} ({', '.join(sorted({s.family for s in part}))}): not fresh, left out")
    out = {s.key for s in both + elsewhere}
    result = {"dir": str(fresh_dir), "samples": [s for s in fresh if s.key not in out], "repeats": repeats,
              "left_out": sorted(s.key for s in both)}
    if seen_dirs:
        result.update(seen_data=[str(d) for d in seen_dirs], left_out_as_seen=sorted(s.key for s in elsewhere))
    return result


def _fresh_scores(folds: list, budget: Budget, fresh: dict, rng) -> dict:
    """Every row's MAPE on the fresh steps the folds priced (``fold["fresh"]``), with its seed ensembles, bootstrap
    intervals and the noise floor of their repeats; drawn after every other figure, so none of those moves."""
    if not all("fresh" in f for f in folds):
        raise UserError(f"--fresh-data {fresh['dir']}: no configuration there has {SIZE_FACTOR:g}x the FLOPs of a "
                        "fold's largest training step; it tests nothing")
    parts = [{"seed": f["seed"], **f["fresh"]} for f in folds]
    errors = {}
    for f in parts:
        true = np.array(f["true_ms"], dtype=float)
        for p, values in f["pred_ms"].items():
            errors.setdefault(p, {})[f["seed"]] = {"fresh": metrics.ape(np.array(values, dtype=float), true)}
    scores = _one_group_scores(errors, parts, budget, rng, "fresh")
    keys = sorted({repeat_key(s) for s in fresh["samples"]})
    return {"data": fresh["dir"], "predictors": scores, "n_configurations": len(fresh["samples"]),
            "left_out_in_data": fresh["left_out"], "noise_floor": noise_floor(keys, fresh["repeats"], budget.labels),
            **{k: fresh[k] for k in ("seen_data", "left_out_as_seen") if k in fresh}}


def _check_kinds(data_dirs, strict: bool) -> None:
    from gnn_ptp import descriptor

    kinds = defaultdict(int)
    for d in data_dirs:
        for m in dataset.measured_configs(d, strict=strict):
            kinds[descriptor.for_env(m.env or {"hardware": m.hardware}).name] += 1
    _refuse_one_kind(kinds)


def _refuse_one_kind(kinds: dict) -> None:
    if len(kinds) < 2:
        (name, n), = kinds.items()
        raise UserError(f"--protocol hardware needs records of two hardware kinds or more; the data holds one: "
                        f"{name} ({n} configurations); add another kind's folder with a second --data")


def _hardware(base, budget, measured, samples, repeats, rng, log, refit=None) -> dict:
    kinds = defaultdict(list)
    for s in samples:
        kinds[s.hardware_name].append(s)
    _refuse_one_kind({k: len(v) for k, v in kinds.items()})
    folds = hardware_folds(sorted(kinds), budget.hardware_folds, budget.hardware_test)
    tasks = [(f, seed) for f in range(len(folds)) for seed in budget.seeds]

    def one(task):
        (train_kinds, test_kind), seed = folds[task[0]], task[1]
        own = [s for k in train_kinds for s in kinds[k]]
        split = dataset.family_split([s.family for s in own], seed, test_families=[],
                                     test_fraction=0.0, val_fraction=base.val_fraction)
        parts = {"train": [s for s in own if split[s.family] == "train"],
                 "val": [s for s in own if split[s.family] == "val"], "test": kinds[test_kind]}
        pred, info = fit_predict(base, budget, seed, parts, measured, log, refit)
        true = np.exp(np.array([float(s.y[0, 3]) for s in parts["test"]]))
        return pred, info, true, [s.precision for s in parts["test"]], _fold_record(parts["test"], pred, true)

    errors = [{p: {} for p in _predictors(budget)} for _ in folds]
    records = []
    for i, (pred, info, true, precisions, record), seconds in _map_folds(budget, one, tasks, log):
        f, seed = tasks[i]
        (train_kinds, test_kind) = folds[f]
        by_precision = {}
        for p, values in pred.items():
            ape = metrics.ape(values, true)
            errors[f].setdefault(p, {})[seed] = {test_kind: ape}
            by_precision[p] = {c: float(np.mean([a for a, q in zip(ape, precisions) if q == c]))
                               for c in sorted(set(precisions))}
        records.append({"train": list(train_kinds), "test": test_kind, "seed": seed, **info,
                        "mape_by_precision": by_precision, **record})
        log(f"hardware {' + '.join(train_kinds)} -> {test_kind} seed {seed}: " + "  ".join(
            f"{p} {errors[f][p][seed][test_kind].mean():5.1f}%" for p in pred) + f"  ({seconds:.0f} s)")
    pairs = {}
    for f, (train_kinds, test_kind) in enumerate(folds):
        scores = {p: score_groups(errors[f][p], rng, budget.bootstrap) for p in errors[f]}
        pairs[f"{' + '.join(train_kinds)} -> {test_kind}"] = {
            "train_kinds": list(train_kinds), "test_kind": test_kind,
            "predictors": {p: {"mape": sc["mean_mape"], "ci95": sc["mean_ci95"]} for p, sc in scores.items()},
            "noise_floor": noise_floor([repeat_key(s) for s in kinds[test_kind]], repeats, budget.labels),
            "n_test": len(kinds[test_kind])}
    return {"pairs": pairs, "kinds": {k: len(v) for k, v in kinds.items()},
            "folds": sorted(records, key=lambda r: (r["test"], len(r["train"]), r["train"], r["seed"]))}


def hardware_folds(kinds: list[str], which: str = "all", test: str | None = None) -> list[tuple[tuple[str, ...], str]]:
    """The ``hardware`` protocol's folds as (training kinds, test kind): each kind onto each other kind
    (``pairs``), all the others together onto each kind (``rest``; the pairs themselves with two kinds),
    or both (``all``), without repeats; with ``test``, only the folds onto that kind."""
    if test is not None and test not in kinds:
        raise UserError(f"--hardware-test {test!r}: not a hardware kind of the data; its kinds: {', '.join(kinds)}"
                        + closest(test, kinds))
    folds = []
    if which in ("pairs", "all") or len(kinds) == 2:
        folds += [((a,), b) for a in kinds for b in kinds if a != b]
    if which in ("rest", "all") and len(kinds) > 2:
        folds += [(tuple(k for k in kinds if k != b), b) for b in kinds]
    return [f for f in folds if test is None or f[1] == test]


# --- output ----------------------------------------------------------------------------------------------


def _pct(x) -> str:
    return "    -" if x is None else f"{x:5.1f}%"


def _ci(ci) -> str:
    return f"[{ci[0]:.1f}, {ci[1]:.1f}]"


def _by_kind_lines(r: dict, trained: str, worst: bool) -> list[str]:
    """``format_result``'s rows of each kind scored alone (``by_kind``), with the worst family for lofo."""
    lines = []
    for kind, row in r.get("by_kind", {}).items():
        lines += ["", f"scored on {kind} alone ({row['n']} configurations, noise floor "
                  f"{_pct(row['noise_floor']).strip()}; {trained}):"]
        for p, sc in row["predictors"].items():
            lines.append((f"  {p:<22}{_pct(sc['mean_mape']):>8}  {_ci(sc['mean_ci95']):<14}"
                          + (f"worst {sc['worst_family']} {_pct(sc['worst_mape']).strip()}" if worst else "")).rstrip())
    return lines


def format_result(r: dict) -> str:
    b = r["budget"]
    lines = [f"protocol {r['protocol']} on {', '.join(r['data'])}: {r['n_samples']} configurations, seeds "
             f"{', '.join(map(str, b['seeds']))}, epochs {b['epochs'] or r['train_config']['epochs']}, "
             f"{r['wall_s']:.0f} s"]
    if b.get("labels", "mean") != "mean":
        lines.append(f"labels: each configuration's {b['labels']} record; the noise floor is its split-half error")
    if r.get("prior_refitted"):
        lines.append(f"prior of {', '.join(r['prior_refitted'])}: refitted in every fold to the fold's training "
                     "configurations (kernels and steps), never to the ones it is scored on")
    lines.append("")
    w = max([18, *(len(p) + 1 for p in r.get("predictors", ()))])  # the predictor column
    if r["protocol"] == "lofo":
        floor = r["noise_floor"]
        lines.append(f"{'predictor':<{w}}{'mean MAPE':>10}  {'95% CI':<14}{'worst family':>22}  {'95% CI':<14}"
                     f"{'pooled':>8}   noise floor {_pct(floor).strip()}")
        for p, sc in r["predictors"].items():
            lines.append(f"{p:<{w}}{_pct(sc['mean_mape']):>10}  {_ci(sc['mean_ci95']):<14}"
                         f"{sc['worst_family'] + ' ' + _pct(sc['worst_mape']).strip():>22}  {_ci(sc['worst_ci95']):<14}"
                         f"{_pct(sc['pooled_mape']):>8}")
        names = list(r["predictors"])
        width = {p: max(12, len(p) + 2) for p in names}
        lines += ["", f"{'family':<20}{'n':>4}" + "".join(f"{p:>{width[p]}}" for p in names) + f"{'noise floor':>13}"]
        for f in r["families"]:
            row = r["predictors"][names[0]]["per_group"][f]
            lines.append(f"{f:<20}{row['n']:>4}" + "".join(
                f"{_pct(r['predictors'][p]['per_group'][f]['mape']):>{width[p]}}" for p in names)
                + f"{_pct(row['noise_floor']):>13}")
        lines += _by_kind_lines(r, "the models trained on every kind's other families", worst=True)
    elif r["protocol"] == "size":
        fold = r["folds"][0]
        lines.append(f"train: {fold['n_train']} configurations <= {fold['train_max_flops']:.3g} FLOPs "
                     f"(+{fold['n_val']} "
                     f"validation); test: {fold['n_test']} >= {r['size_factor']:g}x that "
                     f"({', '.join(fold['test_families'])})")
        lines.append(f"{'predictor':<{w}}{'MAPE':>8}  {'95% CI':<14}   noise floor {_pct(r['noise_floor']).strip()}")
        for p, sc in r["predictors"].items():
            lines.append(f"{p:<{w}}{_pct(sc['mape']):>8}  {_ci(sc['ci95']):<14}")
        lines += _by_kind_lines(r, "the models trained on every kind", worst=False)
        if r.get("fresh"):
            fresh, tested = r["fresh"], fold.get("fresh", {})
            lines += ["", f"fresh steps ({fresh['data']}): {tested.get('n_test', 0)} of its {fresh['n_configurations']} "
                      f"configurations >= {r['size_factor']:g}x the training maximum "
                      f"({tested.get('test_min_flops', 0):.3g}-{tested.get('test_max_flops', 0):.3g} FLOPs), "
                      "priced by the same models",
                      f"{'predictor':<{w}}{'MAPE':>8}  {'95% CI':<14}   noise floor {_pct(fresh['noise_floor']).strip()}"]
            for p, sc in fresh["predictors"].items():
                lines.append(f"{p:<{w}}{_pct(sc['mape']):>8}  {_ci(sc['ci95']):<14}")
    else:
        for pair, row in r["pairs"].items():
            lines.append(f"{pair} (n {row['n_test']}, noise floor {_pct(row['noise_floor']).strip()}): " + "  ".join(
                f"{p} {_pct(v['mape']).strip()} {_ci(v['ci95'])}" for p, v in row["predictors"].items()))
    scales = [f[SCALED]["correction_scale"] for f in r.get("folds", []) if SCALED in f]
    if scales:
        counts = sorted(Counter(scales).items())
        lines += ["", f"{SCALED}: the factor on the correction chosen on each fold's validation families: "
                  + ", ".join(f"{k:g} in {n}" for k, n in counts) + f" of {len(scales)} folds"]
    beyond = [f[BEYOND] for f in r.get("folds", []) if BEYOND in f]
    if beyond:
        counts = sorted(Counter(b["chosen"] for b in beyond).items())
        how = ("fixed by the training config" if all(b.get("chosen_by") == "config" for b in beyond)
               else "chosen on each fold's inner size split")
        lines += [f"{BEYOND}: the factor for larger steps {how}: "
                  + ", ".join(f"{k:g} in {n}" for k, n in counts) + f" of {len(beyond)} folds"]
    across = [f[LOFO_SCALED]["correction_scale"] for f in r.get("folds", []) if LOFO_SCALED in f]
    if across:
        counts = sorted(Counter(across).items())
        lines += [f"{LOFO_SCALED}: the factor chosen for each family on the other families' folds: "
                  + ", ".join(f"{k:g} in {n}" for k, n in counts) + f" of {len(across)} folds"]
        for seed, row in r.get("lofo_scale", {}).items():
            by_factor = ", ".join(f"{k} {_pct(v).strip()}" for k, v in row["mean_mape_by_factor"].items())
            lines.append(f"  over every family (seed {seed}) the protocol chooses {row['chosen']:g}; mean of families "
                         f"by factor: {by_factor}")
    if r.get("ratios"):
        lines += ["", "ridge / gnn MAPE (target >= 1.5x): " + ", ".join(
            f"{k} {v:.2f}x" for k, v in r["ratios"].items() if v is not None)]
    return "\n".join(lines)
