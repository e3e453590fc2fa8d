"""The ``gnn-ptp`` command line: one subcommand per job, heavy imports inside each run function.

A mistake in the user's input is one line on stderr (``gnn-ptp <cmd>: error: ...``) and exit code 2;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from gnn_ptp.errors import UserError, first_line, one_line

PRECISION_HELP = "fp32, tf32, torch-default, amp-fp16, amp-bf16 or bf16"


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line, ``<prog>: error: ...``, exit code 2 (no usage
    block: ``--help`` has it)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):  # also NaN
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number")
    return value


def _bounded_int(low: int, high: int):
    """An argparse type for integers in [low, high], whose error names the allowed range."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (allowed {low} to {high})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: allowed {low} to {high}")
        return value
    return parse


STRICT_HELP = "refuse a dataset with bad record lines instead of skipping and reporting them"


def _check_input_dir(path: str, what: str) -> None:
    """A dataset argument must exist (before any import or work)."""
    from pathlib import Path

    if not Path(path).exists():
        raise UserError(f"{what} {path!r} does not exist (a dataset folder such as datasets/cpu, or a .jsonl file)")


def add_model_args(p: argparse.ArgumentParser, batch_required: bool = False) -> None:
    p.add_argument("spec", help="model spec: hf:<model_type>|hf:<config.json>|torchvision:<name>|"
                                "timm:<name>|py:<file.py>:<factory>|random:<kind>:<seed>")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field / constructor argument (repeatable)")
    p.add_argument("--task", help="hf task head: causal-lm, masked-lm, seq2seq-lm, "
                                  "sequence-classification, image-classification")
    from gnn_ptp.limits import MAX_BATCH_SIZE, MAX_IMAGE_SIZE, MAX_SEQ_LEN

    p.add_argument("--batch-size", type=_bounded_int(1, MAX_BATCH_SIZE), required=batch_required,
                   default=None if batch_required else 8, help="samples per step per GPU (default 8)")
    p.add_argument("--seq-len", type=_bounded_int(1, MAX_SEQ_LEN), help="tokens per sample (text models; default 512)")
    p.add_argument("--image-size", type=_bounded_int(1, MAX_IMAGE_SIZE),
                   help="pixels per side (vision models; default 224)")
    p.add_argument("--optimizer", default="adamw", help="adamw (default), adam or sgd")


def step_config(args, precision: str, target: str = "cuda"):
    from gnn_ptp.spec import Shape, parse_spec
    from gnn_ptp.trace import StepConfig

    spec = parse_spec(args.spec, args.overrides, args.task)
    shape = Shape(args.batch_size, args.seq_len, args.image_size)
    return StepConfig(spec, shape, precision, args.optimizer, target)


# --- graph ---------------------------------------------------------------------------------------


def add_graph_parser(sub) -> None:
    p = sub.add_parser("graph", help="trace one training step and show its cost structure",
                       description="Trace one training step (no GPU needed) and print what it costs: "
                                   "kernels, FLOPs and bytes by phase and by dtype, tensor-core share.")
    add_model_args(p)
    p.add_argument("--precision", default="amp-bf16", help=PRECISION_HELP + " (default amp-bf16)")
    p.add_argument("--target", default="cuda", choices=("cuda", "cpu"),
                   help="trace as an NVIDIA GPU runs it (default) or as a CPU does")
    p.add_argument("--out", help="save the PyTorch Geometric graph here (.pt)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run_graph)


def run_graph(args) -> int:
    from gnn_ptp import graph
    from gnn_ptp.store import atomic_torch_save
    from gnn_ptp.trace import trace_step

    if args.out:
        from gnn_ptp.paths import check_output_file

        check_output_file(args.out, "--out", overwrite=True)
    config = step_config(args, args.precision, args.target)
    traced = trace_step(config)
    data, summary = graph.to_data(traced)
    if args.out:
        atomic_torch_save(data, args.out)
    if args.json:
        print(json.dumps(graph.summary_dict(traced, summary), indent=2))
    else:
        print(graph.summary_table(traced, summary))
        if args.out:
            print(f"graph saved to {args.out}")
    return 0


# --- collect -------------------------------------------------------------------------------------


def add_collect_parser(sub) -> None:
    from gnn_ptp.collect_config import CollectConfig

    d = CollectConfig("", "")
    p = sub.add_parser("collect", help="measure real training steps into datasets/<hardware>/",
                       description="Run every configuration of a grid on this machine's GPU (or CPU) and "
                                   "append one record per configuration. Resumable: a rerun skips what the "
                                   "folder holds. Under torchrun with --ddp: DistributedDataParallel steps.")
    p.add_argument("--grid", required=True, help="grid file (training/grids/*.toml)")
    p.add_argument("--out", required=True, help="dataset folder named for the hardware, e.g. datasets/h100")
    p.add_argument("--device", default=d.device, help="cuda, cpu or auto (default)")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--min-steps", type=int, default=d.min_steps)
    p.add_argument("--min-time-s", type=float, default=d.min_time_s)
    p.add_argument("--max-time-s", type=float, default=d.max_time_s)
    p.add_argument("--overhead-target", type=float, default=d.overhead_target,
                   help="share of wall time building and warm-up may take (default 0.2)")
    p.add_argument("--budget-s", type=_positive_float, help="stop cleanly before this many seconds")
    p.add_argument("--limit", type=_positive_int, help="measure at most this many configurations")
    p.add_argument("--retry-errors", action="store_true", help="measure again configurations that failed")
    p.add_argument("--repeat", action="store_true",
                   help="measure again configurations already held (for run-to-run noise)")
    p.add_argument("--threads", type=_positive_int, help="torch CPU threads (CPU collection)")
    p.add_argument("--ddp", action="store_true", help="measure DDP steps (run under torchrun)")
    p.add_argument("--bucket-cap-mb", type=float, default=d.bucket_cap_mb)
    p.add_argument("--parallel", default=d.parallel, choices=("ddp", "fsdp", "fsdp-no-reshard"),
                   help="under --ddp: DistributedDataParallel (default), FSDP2 fully_shard per block (fsdp), or "
                        "FSDP2 without resharding after the forward (fsdp-no-reshard)")
    p.add_argument("--allow-dir-mismatch", action="store_true")
    p.add_argument("--mode", default=d.mode, choices=("auto", "harvest", "classic"),
                   help="harvest: one model per shape, precision classes swept over it, time-bounded timing, "
                        "per-op profiles; classic: one model per record; auto (default): harvest unless --ddp")
    p.add_argument("--harvest-steps", type=_positive_int, default=d.harvest_steps,
                   help=f"harvest: timed steps per record, at most (default {d.harvest_steps})")
    p.add_argument("--harvest-time-s", type=_positive_float, default=d.harvest_time_s,
                   help=f"harvest: ... or as many as fit in this many seconds (default {d.harvest_time_s})")
    p.add_argument("--harvest-min-steps", type=_positive_int, default=d.harvest_min_steps,
                   help=f"harvest: ... but at least this many (default {d.harvest_min_steps})")
    p.add_argument("--profile", default=d.profile, choices=("sample", "all", "none"),
                   help="harvest: profile one extra step of a sample of records (default), every record, or none")
    p.add_argument("--profile-share", type=float, default=d.profile_share,
                   help=f"harvest: largest share of the wall time profiling may take (default {d.profile_share})")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (configurations by tier, family and status, skip rules) and measure nothing")
    p.set_defaults(run=run_collect)


def run_collect(args) -> int:
    from gnn_ptp.collect import CollectConfig, collect
    from gnn_ptp.paths import check_output_dir

    check_output_dir(args.out, "--out")
    cfg = CollectConfig(grid=args.grid, out=args.out, device=args.device, warmup_steps=args.warmup_steps,
                        min_steps=args.min_steps, min_time_s=args.min_time_s, max_time_s=args.max_time_s,
                        overhead_target=args.overhead_target, budget_s=args.budget_s,
                        retry_errors=args.retry_errors, repeat=args.repeat, limit=args.limit,
                        threads=args.threads, ddp=args.ddp, parallel=args.parallel, bucket_cap_mb=args.bucket_cap_mb,
                        allow_dir_mismatch=args.allow_dir_mismatch, mode=args.mode, harvest_steps=args.harvest_steps,
                        harvest_time_s=args.harvest_time_s, harvest_min_steps=args.harvest_min_steps,
                        profile=args.profile, profile_share=args.profile_share)
    if args.dry_run:
        from gnn_ptp.grid import format_plan

        print(format_plan(cfg))
        return 0
    counts = collect(cfg)
    return 130 if counts["interrupted"] else 0


# --- data ------------------------------------------------------------------------------------------


def add_data_parser(sub) -> None:
    p = sub.add_parser("data", help="inspect dataset folders")
    data_sub = p.add_subparsers(dest="data_command", metavar="DATA_COMMAND")
    data_sub.required = True
    stats = data_sub.add_parser("stats", help="counts by hardware, family, precision, status; noise")
    stats.add_argument("path", help="dataset folder or .jsonl file")
    stats.add_argument("--min-step-ms", type=float, default=10.0,
                       help="noise is also reported for steps at least this long (default 10)")
    stats.add_argument("--json", action="store_true")
    stats.add_argument("--strict", action="store_true", help=STRICT_HELP)
    stats.set_defaults(run=run_data_stats)
    match = data_sub.add_parser("match", help="match the per-op profiles stored beside records onto the traced "
                                              "graphs: the share of measured time each graph node accounts for")
    match.add_argument("path", help="dataset folder (records + profiles/)")
    match.add_argument("--json", action="store_true")
    match.set_defaults(run=run_data_match)


def run_data_stats(args) -> int:
    from gnn_ptp.stats import dataset_stats, format_stats

    s = dataset_stats(args.path, args.min_step_ms, strict=args.strict)
    print(json.dumps(s, indent=2) if args.json else format_stats(s))
    return 0


def run_data_match(args) -> int:
    from gnn_ptp.match import format_match, match_dataset

    result = match_dataset(args.path)
    print(json.dumps(result, indent=2) if args.json else format_match(result))
    return 0


# --- train / evaluate ------------------------------------------------------------------------------


def add_train_parser(sub) -> None:
    p = sub.add_parser("train", help="train the GNN on a dataset folder and write a checkpoint",
                       description="Train the precision-aware GNN on measured records, holding whole model "
                                   "families out; one line per epoch; writes weights + meta.json.")
    p.add_argument("--data", required=True, nargs="+",
                   help="dataset folder, e.g. datasets/h100; several (one per hardware kind) with "
                        "[model] hardware_descriptor = true")
    p.add_argument("--config", help="training config (TOML), e.g. training/default.toml")
    p.add_argument("--out", required=True, help="checkpoint folder, e.g. checkpoints/h100")
    p.add_argument("--seed", type=int, help="overrides the config's seed")
    p.add_argument("--epochs", type=_positive_int, help="overrides the config's epochs")
    p.add_argument("--threads", type=_positive_int, help="torch CPU threads")
    p.add_argument("--baselines", action="store_true",
                   help="also train the precision-unaware baseline (into OUT/baselines/)")
    p.add_argument("--wandb", action="store_true", help="log config, curves and metrics to Weights & Biases")
    p.add_argument("--wandb-project", default="gnn-ptp")
    p.add_argument("--strict", action="store_true", help=STRICT_HELP)
    p.set_defaults(run=run_train)


def run_train(args) -> int:
    import dataclasses

    from gnn_ptp.paths import check_output_dir
    from gnn_ptp.train import load_train_config, train

    check_output_dir(args.out, "--out")
    for d in args.data:
        _check_input_dir(d, "--data")
    args.data = args.data[0] if len(args.data) == 1 else args.data
    cfg = load_train_config(args.config)
    changes = {k: v for k, v in (("seed", args.seed), ("epochs", args.epochs), ("threads", args.threads))
               if v is not None}
    cfg = dataclasses.replace(cfg, **changes)
    logger = None
    if args.wandb:
        from gnn_ptp.tracking import WandbLogger

        logger = WandbLogger({**cfg.to_dict(), "data": args.data}, project=args.wandb_project,
                             tags=["train"])
    try:
        result = train(cfg, args.data, args.out, logger=logger, strict=args.strict)
        if args.baselines:
            families = result["split"]
            first = (result.get("ensemble") or {}).get("members", [{}])[0]
            unaware = dataclasses.replace(  # one model, on the (first member's) split
                cfg, model=dataclasses.replace(cfg.model, precision_aware=False), ensemble_seeds=None,
                seed=first.get("seed", cfg.seed),
                test_families=tuple(f for f, s in families.items() if s == "test"),
                val_families=tuple(first["val_families"]) if first else
                tuple(f for f, s in families.items() if s == "val"))
            from pathlib import Path

            print("training the precision-unaware baseline (graphs traced as fp32) ...", file=sys.stderr)
            train(unaware, args.data, Path(args.out) / "baselines" / "precision_unaware", strict=args.strict)
    finally:
        if logger:
            logger.finish()
    return 0


PROTOCOL_ONLY = {"config": None, "epochs": None, "patience": None, "families": None, "seeds": "0",
                 "variants": "gnn,gnn-prior", "threads": None, "bootstrap": 2000, "shipped_prior": False,
                 "jobs": 1, "hardware_folds": "all", "hardware_test": None, "hardware_transfer": "nearest",
                 "transfer_mode": "sized", "no_depthwise_law": False, "refit_per_category": False, "slow_conv_law": None,
                 "labels": None, "profiler_cost": False, "depthwise_stride": False, "fresh_data": None,
                 "depthwise_floor": False, "attention_law": False, "depthwise_paths": False, "seen_data": None,
                 "conv_blocks": False, "matmul_cap": False}
"""``evaluate``'s options that only a --protocol run reads, with their defaults."""


def add_evaluate_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="score a checkpoint against measurements and baselines",
                       description="MAPE, median and p90 APE overall, per precision and per held-out family, "
                                   "side by side with the precision-unaware GNN, a roofline and a ridge "
                                   "model on graph totals. With --protocol, train and score many models "
                                   "instead (gnn_ptp/protocol.py): leave one family out, size extrapolation "
                                   "or cross-hardware, with bootstrap intervals and the label noise floor.")
    p.add_argument("--checkpoint", help="checkpoint folder (required without --protocol)")
    p.add_argument("--data", required=True, nargs="+",
                   help="dataset folder; --protocol hardware takes one folder per hardware kind, and lofo or "
                        "size over several kinds' folders train one model on all and score each kind alone too")
    p.add_argument("--split", default="test", help="test (held-out families, default), val, train or all")
    p.add_argument("--plot", help="write a parity plot here (.png, .pdf or .svg; replaced if it exists)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--strict", action="store_true", help=STRICT_HELP)
    g = p.add_argument_group("protocol (trains its own models; no --checkpoint)")
    g.add_argument("--protocol", help="lofo (leave one family out), size (train small, test >= 4x larger) "
                                      "or hardware (train on one kind, test on another)")
    g.add_argument("--config", help="training config of the GNN variants (TOML; default: built-in defaults)")
    g.add_argument("--epochs", type=_positive_int, help="epochs per model (budget; default: the config's)")
    g.add_argument("--patience", type=_positive_int, help="early-stopping patience (default: the config's)")
    g.add_argument("--families", help="lofo: hold out only these families, comma-separated (budget)")
    g.add_argument("--seeds", default=PROTOCOL_ONLY["seeds"],
                   help="comma-separated seeds; each retrains every model (default 0)")
    g.add_argument("--variants", default=PROTOCOL_ONLY["variants"],
                   help="GNN variants: gnn (the config as given), gnn-prior (log-ratio to the physical prior, "
                        "hardware descriptor fed in); default both")
    g.add_argument("--threads", type=_positive_int, help="torch CPU threads for training (per job)")
    g.add_argument("--jobs", type=_positive_int, default=PROTOCOL_ONLY["jobs"],
                   help="folds trained at once, each in its own process with --threads threads (default 1; "
                        "jobs x threads at most the cores); the results do not change")
    g.add_argument("--hardware-folds", default=PROTOCOL_ONLY["hardware_folds"],
                   help="hardware: pairs (train on each kind, test on each other), rest (train on all the "
                        "other kinds, test on the one left out) or all (default)")
    g.add_argument("--hardware-test", default=PROTOCOL_ONLY["hardware_test"], metavar="KIND",
                   help="hardware: only the folds that test on this kind (its descriptor name, e.g. "
                        "amd-epyc-family-25-model-1); default every kind")
    g.add_argument("--hardware-transfer", default=PROTOCOL_ONLY["hardware_transfer"],
                   help="hardware: price a kind tested on by the prior of the training kind with the nearest "
                        "ceilings (nearest, default) or the geometric mean of every training kind's (mean)")
    g.add_argument("--transfer-mode", default=PROTOCOL_ONLY["transfer_mode"],
                   help="hardware, CPU kinds: move a prior to another kind by each kernel's speed-up at its "
                        "size in the step probes both kinds measured, else as split (sized, default since "
                        "2026-12-07); by only each kernel's time at the ceilings by their ratios, the rest by the "
                        "non-GEMM ratio (split, the default from 2026-11-26); or every peak by the ceilings' "
                        "ratios (ceilings, the form before)")
    g.add_argument("--no-depthwise-law", action="store_true",
                   help="CPU data with per-op profiles: the prior refitted in every fold prices depthwise "
                        "convolutions by its FLOPs curves, as before 2026-11-26, instead of a power law in their "
                        "shape (the default: README *The CPU prior*)")
    g.add_argument("--slow-conv-law", default=PROTOCOL_ONLY["slow_conv_law"], metavar="DTYPES",
                   help="CPU data with per-op profiles: the prior refitted in every fold prices the dense "
                        "convolutions of these dtypes (comma-separated: fp32, bf16) by an additive law in their "
                        "shape (per call, multiply-add, weight element per sample, im2col and input/output "
                        "element) instead of its FLOPs curves; default: as the kind's shipped section does")
    g.add_argument("--profiler-cost", action="store_true",
                   help="CPU data with per-op profiles: the prior refitted in every fold reads each profiled op's "
                        "time less what the profiler adds per op it records (node_labels.profiler_cost_us), "
                        "besides its section's options; default: as the kind's shipped section does")
    g.add_argument("--depthwise-stride", action="store_true",
                   help="CPU data with per-op profiles: the prior refitted in every fold has the stride among its "
                        "depthwise law's terms (prior_fit.fit_depthwise), besides its section's options; default: "
                        "as the kind's shipped section does")
    g.add_argument("--depthwise-floor", action="store_true",
                   help="CPU data with per-op profiles: the prior refitted in every fold never prices a depthwise "
                        "convolution faster than the fastest one its law was fitted to (prior_fit."
                        "fit_depthwise_floor), besides its section's options; default: as the kind's shipped "
                        "section does")
    g.add_argument("--attention-law", action="store_true",
                   help="CPU data with per-op profiles: the prior refitted in every fold prices fused attention by "
                        "a sum of the costs of aten's CPU kernel's loops (per call, block pair, query row, score, "
                        "multiply-add, byte: prior_fit.fit_attention), besides its section's options; default: as "
                        "the kind's shipped section does")
    g.add_argument("--depthwise-paths", action="store_true",
                   help="CPU data with per-op profiles: the prior refitted in every fold prices depthwise "
                        "convolutions by a sum of costs per kernel path (stride, taps: prior_fit."
                        "fit_depthwise_paths) in place of the power law, besides its section's options; default: "
                        "as the kind's shipped section does")
    g.add_argument("--conv-blocks", action="store_true",
                   help="CPU data with per-op profiles: the prior refitted in every fold gives its dense "
                        "convolutions' law (--slow-conv-law or the section's) a cost per weight element per call "
                        "and one per multiply-add of a convolution whose channels are not multiples of 16 "
                        "(prior_fit.fit_slow_conv(conv_blocks=True)), besides its section's options; default: as "
                        "the kind's shipped section does")
    g.add_argument("--matmul-cap", action="store_true",
                   help="CPU data with per-op profiles: the prior refitted in every fold holds each matmul curve at "
                        "most at the fastest fraction of its ceiling it reaches on the fold's training kernels "
                        "(prior_fit.fit_device(matmul_cap=True)), besides its section's options; default: as the "
                        "kind's shipped section does")
    g.add_argument("--refit-per-category", action="store_true",
                   help="data with per-op profiles: the prior refitted in every fold takes per-category vector "
                        "and bandwidth curves and no batch-norm ramp, as before 2026-11-26's eighteenth session, "
                        "instead of the options its shipped section was fitted with (the default)")
    g.add_argument("--labels", default=PROTOCOL_ONLY["labels"],
                   help="a configuration measured more than once is labelled by the mean of its records (mean) "
                        "or by its fastest record (fastest: for a shared VM whose interference only slows steps "
                        "down; the noise floor is then measured by split halves); default: the training "
                        "config's labels (mean unless it says)")
    g.add_argument("--fresh-data", metavar="DIR",
                   help="size: a folder of new configurations (of a kind --data trains on, none of them in it) "
                        "that every fold's models also price where they have >= 4x the fold's largest training "
                        "step, scored apart; the figures on --data's own test steps do not move")
    g.add_argument("--seen-data", metavar="DIR", action="append",
                   help="with --fresh-data (repeatable): a folder of configurations already seen (an earlier fresh "
                        "set a form was chosen on); a --fresh-data configuration also there is left out, said so")
    g.add_argument("--bootstrap", type=_positive_int, default=PROTOCOL_ONLY["bootstrap"],
                   help="bootstrap resamples (default 2000)")
    g.add_argument("--shipped-prior", action="store_true",
                   help="GPU data with per-op profiles: score (and train over) the shipped prior instead of "
                        "refitting it in every fold; faster, but that prior has seen the held-out families")
    p.set_defaults(run=run_evaluate)


def _int_list(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{what} {text!r}: comma-separated integers, e.g. 0,1,2") from None
    if not values:
        raise UserError(f"{what} {text!r}: give at least one")
    return values


def run_evaluate(args) -> int:
    if args.protocol is not None:
        return run_protocol(args)
    given = [f"--{name.replace('_', '-')}" for name, default in PROTOCOL_ONLY.items() if getattr(args, name) != default]
    if given:
        raise UserError(f"{', '.join(given)}: only with --protocol lofo|size|hardware (evaluate --checkpoint scores "
                        "a trained checkpoint and trains nothing)")
    from gnn_ptp.evaluate import PLOT_SUFFIXES, evaluate, format_table
    from gnn_ptp.paths import check_output_file

    if args.checkpoint is None:
        raise UserError("evaluate needs --checkpoint (or --protocol lofo|size|hardware, which trains its own)")
    if len(args.data) > 1:
        raise UserError(f"--data: one folder without --protocol, got {len(args.data)}")
    args.data = args.data[0]
    if args.plot:
        check_output_file(args.plot, "--plot", overwrite=True, suffixes=PLOT_SUFFIXES)
    _check_input_dir(args.data, "--data")
    result = evaluate(args.checkpoint, args.data, args.split, args.plot, strict=args.strict)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0


def run_protocol(args) -> int:
    from gnn_ptp.errors import closest
    from gnn_ptp.protocol import PROTOCOLS, Budget, format_result, run

    if args.protocol not in PROTOCOLS:
        raise UserError(f"--protocol {args.protocol!r}: allowed: {', '.join(PROTOCOLS)}"
                        + closest(args.protocol, PROTOCOLS))
    for flag, value in (("--checkpoint", args.checkpoint), ("--plot", args.plot)):
        if value is not None:
            raise UserError(f"{flag} does not go with --protocol (the protocol trains its own models)")
    for d in args.data:
        _check_input_dir(d, "--data")
    if args.fresh_data is not None:
        _check_input_dir(args.fresh_data, "--fresh-data")
    if args.seen_data and args.fresh_data is None:
        raise UserError("--seen-data: only with --fresh-data (it leaves configurations out of the fresh set)")
    for d in args.seen_data or ():
        _check_input_dir(d, "--seen-data")
    families = tuple(f.strip() for f in args.families.split(",") if f.strip()) if args.families else None
    budget = Budget(epochs=args.epochs, patience=args.patience, families=families,
                    seeds=_int_list(args.seeds, "--seeds"),
                    variants=tuple(v.strip() for v in args.variants.split(",") if v.strip()),
                    threads=args.threads, bootstrap=args.bootstrap, refit_prior=not args.shipped_prior,
                    jobs=args.jobs, hardware_folds=args.hardware_folds, hardware_test=args.hardware_test,
                    hardware_transfer=args.hardware_transfer, transfer_mode=args.transfer_mode,
                    depthwise_law=not args.no_depthwise_law, refit_as_shipped=not args.refit_per_category,
                    labels=args.labels, profiler_cost=args.profiler_cost, depthwise_stride=args.depthwise_stride,
                    depthwise_floor=args.depthwise_floor, attention_law=args.attention_law,
                    depthwise_paths=args.depthwise_paths, conv_blocks=args.conv_blocks,
                    matmul_cap=args.matmul_cap,
                    slow_conv_law=tuple(d.strip() for d in (args.slow_conv_law or "").split(",") if d.strip()))
    result = run(args.protocol, args.data, args.config, budget, strict=args.strict, fresh_dir=args.fresh_data,
                 seen_dirs=tuple(args.seen_data or ()))
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return 0


# --- sweep -----------------------------------------------------------------------------------------


def add_sweep_parser(sub) -> None:
    p = sub.add_parser("sweep", help="search GNN architectures and training hyperparameters with Optuna",
                       description="Optuna study over layer, width, depth, norm, readout, dropout, heads, "
                                   "learning rate, weight decay and batch size, scored by validation MAPE, "
                                   "with median pruning; one line per trial. Workers that share --storage "
                                   "and --study add trials to one study (give each its own --seed).")
    p.add_argument("--data", required=True, help="dataset folder, e.g. datasets/h100")
    p.add_argument("--trials", type=_positive_int, required=True, help="trials to run in this worker")
    p.add_argument("--storage", help="database URL (postgresql://user:pass@host/db, sqlite:///file.db) or a "
                                     "SQLite file path (default: DATA/.cache/sweep.db)")
    p.add_argument("--study", default="gnn-ptp", help="study name (default gnn-ptp)")
    p.add_argument("--config", help="base training config (TOML): split, seed, memory weight, epochs...")
    p.add_argument("--epochs", type=_positive_int, help="epochs per trial (overrides the config's)")
    p.add_argument("--threads", type=_positive_int, help="torch CPU threads")
    p.add_argument("--write-best", metavar="PATH", help="write the best trial as a training config (TOML)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.set_defaults(run=run_sweep)


def run_sweep(args) -> int:
    from gnn_ptp.sweep import require, sweep
    from gnn_ptp.train import load_train_config

    if args.write_best:
        from gnn_ptp.paths import check_output_file

        check_output_file(args.write_best, "--write-best", overwrite=True)
    _check_input_dir(args.data, "--data")
    optuna = require("optuna")
    base = load_train_config(args.config)
    if args.threads:  # a setting of this machine, not of the trials: kept out of --write-best's config
        import torch

        torch.set_num_threads(args.threads)
    if not args.debug:
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # our one line per trial replaces Optuna's
    sweep(args.data, args.trials, storage=args.storage, study_name=args.study, out_config=args.write_best,
          epochs=args.epochs, seed=args.seed, base=base)
    return 0


# --- predict ---------------------------------------------------------------------------------------


MAX_MESSAGE_BYTES = 1 << 40
"""The largest all-reduce message ``--bytes`` accepts (1 TiB: far beyond any GPU's memory)."""


def _bytes(text: str) -> int:
    """64M, 64MiB, 1G, 4096 -> bytes (K/M/G are powers of 1024, as nccl-tests' -b/-e)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4096, 64K, 25M, 1G)") from None
    if not 1 <= value <= MAX_MESSAGE_BYTES:  # also NaN and inf
        raise argparse.ArgumentTypeError(f"{text!r} is out of range: allowed 1 byte to 1T "
                                         f"({MAX_MESSAGE_BYTES} bytes)")
    return int(value)


def _procs(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of process counts") from None
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: every process count must be at least 2")
    return values


def add_comm_parser(sub) -> None:
    p = sub.add_parser("comm", help="predicted time of one all-reduce, as nccl-tests reports it",
                       description="Predict one all-reduce of --bytes over --gpus ranks with an interconnect "
                                   "profile: time, algbw, busbw, the fit used. Compare with any published "
                                   "all_reduce_perf table. --list shows the profiles and their fit errors.")
    p.add_argument("--bytes", type=_bytes, help="message size: 4096, 64K, 25M, 1G")
    p.add_argument("--gpus", type=_positive_int, help="ranks taking part")
    p.add_argument("--nodes", type=_positive_int, help="nodes they are on (default: 8 GPUs a node)")
    p.add_argument("--interconnect", help="shipped profile name or a calibrate-comm file "
                                          "(default: h100-nvswitch on one node, h100-ib-ndr400 beyond)")
    p.add_argument("--list", action="store_true", help="list the profiles with their fits and errors")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_comm)


def run_comm(args) -> int:
    from gnn_ptp import interconnect
    from gnn_ptp.calibrate import format_profile

    if args.list:
        profiles = interconnect.builtin()
        if args.json:
            print(json.dumps({n: p.to_dict() for n, p in profiles.items()}, indent=1))
        else:
            print("\n\n".join(format_profile(p) for p in profiles.values()))
        return 0
    if args.bytes is None or args.gpus is None:
        raise UserError("give --bytes and --gpus (or --list)")
    profile = (interconnect.load(args.interconnect) if args.interconnect
               else interconnect.default_for("h100", args.gpus, args.nodes))
    r = profile.allreduce(args.bytes, args.gpus, args.nodes)
    if args.json:
        print(json.dumps(r.to_dict(), indent=1))
        return 0
    from gnn_ptp.comm import format_bytes

    print(f"all-reduce of {format_bytes(r.message_bytes)} over {r.gpus} ranks on {r.nodes} node(s), "
          f"{r.interconnect}")
    print(f"{'size (B)':>14}{'time (us)':>12}{'algbw (GB/s)':>14}{'busbw (GB/s)':>14}  algorithm")
    print(f"{int(r.message_bytes):>14}{r.time_us:>12.1f}{r.algbw_GBps:>14.2f}{r.busbw_GBps:>14.2f}  "
          f"{r.algorithm} [{r.level}]")
    if not r.measured:
        print(f"note: {r.gpus} ranks is not a measured world size of {r.level}: extrapolated "
              "(latency ~ log2 ranks, bus bandwidth held)")
    return 0


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate-comm", help="measure all-reduce times and write an interconnect profile",
                       description="Under torchrun (NCCL on GPUs, gloo otherwise) every rank measures and rank "
                                   "0 writes --out; without torchrun it starts --procs gloo processes on this "
                                   "machine. Fits already in --out at other world sizes are kept.")
    p.add_argument("--out", type=lambda s: __import__("pathlib").Path(s), required=True,
                   help="profile file to write (JSON); predict/comm --interconnect read it")
    p.add_argument("--name", help="profile name (default: the file name)")
    p.add_argument("--procs", type=_procs, help="world sizes to start here without torchrun (default 2)")
    p.add_argument("--min-bytes", type=_bytes, help="smallest message (default 4K)")
    p.add_argument("--max-bytes", type=_bytes, help="largest message (default 64M)")
    p.add_argument("--fit-min-bytes", type=_bytes, help="fit the line from this size up (default 1M)")
    p.add_argument("--min-time-s", type=_positive_float, help="timed calls per size fill this long (default 0.2)")
    p.add_argument("--description", help="what this profile is (hosts, network)")
    p.add_argument("--hardware", type=lambda s: tuple(x for x in s.split(",") if x),
                   help="hardware labels this profile is the default for (comma-separated, e.g. cpu)")
    p.add_argument("--collectives", type=lambda s: tuple(x for x in s.split(",") if x),
                   help="collectives to measure, comma-separated: all_reduce (default), all_gather, "
                        "reduce_scatter (FSDP's); fits of the others already in --out are kept")
    p.add_argument("--fsdp", action="store_true", default=None,
                   help="also measure FSDP2's host overheads on synthetic stacks (one machine, gloo)")
    p.add_argument("--pool", nargs="+", type=lambda s: __import__("pathlib").Path(s), metavar="RUN",
                   help="measure nothing: pool two or more runs' profile files of the same measurement on one "
                        "machine (median time per size, overheads fitted to every run's stacks) into --out")
    p.set_defaults(run=run_calibrate)


def run_calibrate(args) -> int:
    from gnn_ptp.calibrate import calibrate, check_out, config_from_args, format_profile

    cfg = config_from_args(args)
    cfg.validate()
    check_out(cfg)
    if getattr(args, "pool", None):
        from gnn_ptp.calibrate import pool

        profile = pool(cfg, args.pool)
    else:
        profile = calibrate(cfg)
    if profile is not None:
        print(format_profile(profile))
        print(f"wrote {args.out}")
    return 0


def add_predict_parser(sub) -> None:
    p = sub.add_parser("predict", help="predict the time of a training step (and job) on a GPU",
                       description="Trace the model's training step and predict forward, backward, optimizer "
                                   "and total time per step with a trained checkpoint.")
    add_model_args(p)
    p.add_argument("--precision", default="amp-bf16", help=PRECISION_HELP + " or all (default amp-bf16)")
    p.add_argument("--gpus", type=_positive_int, default=1, help="data-parallel GPUs (default 1)")
    p.add_argument("--nodes", type=_positive_int, help="nodes the GPUs are on (default: 8 GPUs a node)")
    p.add_argument("--interconnect", help="interconnect profile name or calibrate-comm file (default: the "
                                          "hardware's: h100-nvswitch / h100-ib-ndr400; cpu-gloo)")
    p.add_argument("--bucket-cap-mb", type=_positive_float, default=25.0,
                   help="DDP bucket_cap_mb (default 25; the first bucket is 1 MiB)")
    p.add_argument("--grad-accum", type=_positive_int, default=1,
                   help="micro-steps per optimizer step; DDP all-reduces once per optimizer step (default 1)")
    p.add_argument("--grad-compression", choices=["none", "fp16", "bf16"], default="none",
                   help="DDP communication hook that all-reduces fp32 gradients in half precision")
    p.add_argument("--parallel", default="ddp",
                   help="how --gpus share the model: ddp (default, replicated), fsdp (FSDP2 full sharding, "
                        "ZeRO-3), fsdp-no-reshard (ZeRO-2-like) or auto (the fastest that fits in memory)")
    p.add_argument("--hardware", default="h100", help="which shipped checkpoint: h100 (default), cpu, ...")
    p.add_argument("--checkpoint", help="checkpoint folder (overrides --hardware)")
    p.add_argument("--analytic", action="store_true",
                   help="answer from the calibrated physical prior even where a checkpoint is shipped "
                        "(h100, h200, a100; README: Evaluation of the shipped H200 checkpoint), or with "
                        "--hardware cpu from a CPU kind's prior (--cpu-kind; its own where fitted to its steps)")
    p.add_argument("--cpu-kind", help="with --hardware cpu and a checkpoint trained with hardware descriptors: "
                                      "the CPU to predict for, by its stored descriptor "
                                      "(gnn_ptp/hardware_descriptors/<name>.json), or 'this' for this machine's")
    p.add_argument("--steps", type=_positive_int, help="steps in the job: prints the job's time")
    p.add_argument("--epochs", type=_positive_float, help="epochs in the job (needs --dataset-size)")
    p.add_argument("--dataset-size", type=_positive_int, help="samples per epoch")
    p.add_argument("--gpu-hour-cost", type=_positive_float, help="price of one GPU-hour: prints the cost")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the on-disk graph cache")
    p.add_argument("--max-batch-size", action="store_true",
                   help="find the largest batch that fits in one device's memory, per precision class "
                        "(analytic memory from the trace), with its step time and throughput")
    p.add_argument("--explain", action="store_true",
                   help="also print the top ops by predicted time with their share of the step (per phase; "
                        "across precision classes with --precision all)")
    p.add_argument("--top", type=_positive_int, default=8, help="ops --explain shows (default 8)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_predict)


def run_predict(args) -> int:
    if args.max_batch_size:
        return run_max_batch_size(args)
    from gnn_ptp.prediction import format_predictions, predict_many

    precisions = [args.precision]  # "all": every class the checkpoint was trained on
    preds = predict_many(args.spec, precisions, args.batch_size, seq_len=args.seq_len,
                         image_size=args.image_size, gpus=args.gpus, nodes=args.nodes,
                         interconnect=args.interconnect, bucket_cap_mb=args.bucket_cap_mb,
                         grad_accum=args.grad_accum, grad_compression=args.grad_compression,
                         parallel=args.parallel, hardware=args.hardware,
                         checkpoint=args.checkpoint, optimizer=args.optimizer, overrides=args.overrides,
                         task=args.task, steps=args.steps, epochs=args.epochs, dataset_size=args.dataset_size,
                         gpu_hour_cost=args.gpu_hour_cost, use_disk_cache=not args.no_cache,
                         cpu_kind=args.cpu_kind, analytic=args.analytic)
    if args.json:
        rows = [p.to_dict() for p in preds]
        if args.precision == "all":
            fastest = min(preds, key=lambda p: p.iteration_ms).precision
            print(json.dumps({"predictions": rows, "fastest": fastest}, indent=2))
        else:
            print(json.dumps(rows[0], indent=2))
    else:
        print(format_predictions(preds))
        if args.explain:
            from gnn_ptp.explain import format_explain
            from gnn_ptp.node_labels import read_meta

            print()
            print(format_explain(preds, args.top, read_meta(preds[0].checkpoint) if preds[0].checkpoint else {}))
    return 0


def run_max_batch_size(args) -> int:
    from gnn_ptp.prediction import format_max_batch, max_batch_sizes

    fits, notes = max_batch_sizes(args.spec, [args.precision], seq_len=args.seq_len, image_size=args.image_size,
                                  hardware=args.hardware, checkpoint=args.checkpoint, optimizer=args.optimizer,
                                  overrides=args.overrides, task=args.task, use_disk_cache=not args.no_cache,
                                  analytic=args.analytic)
    if args.json:
        print(json.dumps({"fits": [f.to_dict() for f in fits], "notes": notes}, indent=2))
    else:
        print(format_max_batch(args.spec, fits, notes, args.hardware))
    return 0


# --- main ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from gnn_ptp import __version__

    parser = _Parser(
        prog="gnn-ptp",
        description="Predict how long a PyTorch training step takes on an NVIDIA H100, "
                    "for any model, batch size and precision setting.")
    parser.add_argument("--version", action="version", version=f"gnn-ptp {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_graph_parser(sub)
    add_collect_parser(sub)
    add_data_parser(sub)
    add_train_parser(sub)
    add_evaluate_parser(sub)
    add_sweep_parser(sub)
    add_predict_parser(sub)
    add_comm_parser(sub)
    add_calibrate_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.debug:
        _quiet_libraries()
    name = f"gnn-ptp {args.command}" + (f" {args.data_command}" if getattr(args, "data_command", None) else "")
    try:
        return args.run(args)
    except UserError as e:
        if args.debug:
            raise
        print(f"{name}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a failure of ours or of the model's code: one line, --debug for more
        if args.debug:
            raise
        from gnn_ptp.trace import TraceError

        kind = "error" if isinstance(e, TraceError) else f"internal error ({type(e).__name__})"
        print(f"{name}: {kind}: {one_line(first_line(e) or e)} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


def _quiet_libraries() -> None:
    """Deprecation chatter from torch and transformers is not for our users; --debug keeps it."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    # torch logs a failing fake-tensor op with its traceback before raising; the raised error is reported
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


if __name__ == "__main__":
    sys.exit(main())
