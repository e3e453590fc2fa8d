"""Collection grids: plain TOML files in training/grids/ that expand into configurations to measure.

    name = "cpu"                          # records go to <out>/<name>.jsonl
    precisions = ["fp32", "amp-bf16"]     # defaults for every entry below
    optimizers = ["adamw"]

    [[model]]                             # a zoo model: the cartesian product of its lists
    spec = "hf:gpt2"
    set = { n_layer = 2, n_embd = 128, n_head = 4 }
    batch_size = [2, 8]
    seq_len = [64, 256]

    [[random]]                            # random architectures: one per seed, shapes drawn per seed
    kind = "transformer"
    seeds = [0, 30]                       # seeds 0..29
    batch_size = [1, 2, 4, 8]
    seq_len = [32, 64, 128]
    samples = 2                           # shapes drawn per seed
    max_params = 20_000_000               # skip seeds whose model is larger

    [[model]]
    spec = "hf:llama"
    tier = 2                              # tiers run in order: tier 1 first (default 1)

    [[skip]]                              # recorded as skipped, never measured
    spec = "hf:llama"
    batch_size_min = 8
    precisions = ["fp32", "tf32", "torch-default"]
    torch_below = "2.14"                  # only where the installed torch is older
    reason = "GQA attention takes the math path before torch 2.14: > 80 GB"

Entries are interleaved round-robin within a tier, so that a run cut short by its budget has covered
every entry of the tiers it reached; batch sizes run ascending within an entry.
"""

from __future__ import annotations

import itertools
import random
import tomllib
from pathlib import Path

from gnn_ptp.errors import UserError, closest
from gnn_ptp.precision import PRECISION_NAMES
from gnn_ptp.trace import OPTIMIZERS

TOP_KEYS = {"name", "description", "precisions", "optimizers", "model", "random", "skip"}
MODEL_KEYS = {"spec", "set", "task", "batch_size", "seq_len", "image_size", "precisions", "optimizers", "tier"}
RANDOM_KEYS = {"kind", "seeds", "set", "batch_size", "seq_len", "image_size", "samples", "max_params",
               "precisions", "optimizers", "tier"}
SKIP_KEYS = {"spec", "set", "batch_size_min", "seq_len_min", "precisions", "torch_below", "reason"}


def _check_keys(where: str, table: dict, allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            raise UserError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}"
                            + closest(key, allowed))


def _list(value) -> list:
    if value is None:
        return [None]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _check_names(where: str, names: list, allowed: tuple[str, ...], what: str) -> None:
    for name in names:
        if name not in allowed:
            raise UserError(f"{where}: unknown {what} {name!r}; allowed: {', '.join(allowed)}"
                            + closest(str(name), allowed))


def load_grid(path: str | Path) -> tuple[str, list[dict]]:
    """Read a grid file; return its name and the configurations it expands to, interleaved."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"grid file {str(path)!r} does not exist")
    try:
        grid = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"grid file {path}: {e}") from None
    _check_keys(str(path), grid, TOP_KEYS)
    default_precisions = grid.get("precisions", list(PRECISION_NAMES))
    default_optimizers = grid.get("optimizers", ["adamw"])
    tiers: dict[int, list[list[dict]]] = {}
    for i, entry in enumerate(grid.get("model", [])):
        where = f"{path} [[model]] #{i + 1}"
        _check_keys(where, entry, MODEL_KEYS)
        if "spec" not in entry:
            raise UserError(f"{where}: missing 'spec'")
        tiers.setdefault(_tier(where, entry), []).append(
            _expand_model(where, entry, default_precisions, default_optimizers))
    for i, entry in enumerate(grid.get("random", [])):
        where = f"{path} [[random]] #{i + 1}"
        _check_keys(where, entry, RANDOM_KEYS)
        tiers.setdefault(_tier(where, entry), []).append(
            _expand_random(where, entry, default_precisions, default_optimizers))
    rules = [_skip_rule(f"{path} [[skip]] #{i + 1}", rule) for i, rule in enumerate(grid.get("skip", []))]
    configs = []
    for tier in sorted(tiers):
        for group in itertools.zip_longest(*tiers[tier]):
            for config in group:
                if config is not None:
                    config["tier"] = tier
                    reason = next((r["reason"] for r in rules if _matches(r, config)), None)
                    if reason:
                        config["_skip"] = reason
                    configs.append(config)
    return grid.get("name", path.stem), configs


def _tier(where: str, entry: dict) -> int:
    tier = entry.get("tier", 1)
    if not isinstance(tier, int) or isinstance(tier, bool) or tier < 1:
        raise UserError(f"{where}: tier must be a positive integer, got {tier!r}")
    return tier


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("+")[0].split(".")[:2] if x.isdigit())


def _skip_rule(where: str, rule: dict) -> dict:
    _check_keys(where, rule, SKIP_KEYS)
    for key in ("spec", "reason"):
        if not isinstance(rule.get(key), str):
            raise UserError(f"{where}: {key!r} (a string) is required")
    _check_names(where, rule.get("precisions", list(PRECISION_NAMES)), PRECISION_NAMES, "precision")
    if "torch_below" in rule and len(_version(str(rule["torch_below"]))) != 2:
        raise UserError(f"{where}: torch_below must be a version like \"2.14\", got {rule['torch_below']!r}")
    return rule


def _matches(rule: dict, config: dict) -> bool:
    """Whether a ``[[skip]]`` rule covers a configuration on the installed torch."""
    import torch

    return (config["spec"] == rule["spec"]
            and all((config.get("set") or {}).get(k) == v for k, v in rule.get("set", {}).items())
            and config["batch_size"] >= rule.get("batch_size_min", 0)
            and (config.get("seq_len") or 0) >= rule.get("seq_len_min", 0)
            and config["precision"] in rule.get("precisions", PRECISION_NAMES)
            and ("torch_below" not in rule or _version(torch.__version__) < _version(str(rule["torch_below"]))))


def _expand_model(where, entry, default_precisions, default_optimizers) -> list[dict]:
    precisions = entry.get("precisions", default_precisions)
    optimizers = entry.get("optimizers", default_optimizers)
    _check_names(where, precisions, PRECISION_NAMES, "precision")
    _check_names(where, optimizers, OPTIMIZERS, "optimizer")
    out = []
    for batch, seq, image, optimizer, precision in itertools.product(
            sorted(_list(entry.get("batch_size", 8))), _list(entry.get("seq_len")), _list(entry.get("image_size")),
            optimizers, precisions):
        out.append({"spec": entry["spec"], "set": dict(entry.get("set", {})), "task": entry.get("task"),
                    "batch_size": batch, "seq_len": seq, "image_size": image,
                    "precision": precision, "optimizer": optimizer})
    return out


def _expand_random(where, entry, default_precisions, default_optimizers) -> list[dict]:
    from gnn_ptp import random_models

    kind = entry.get("kind")
    if kind not in random_models.KINDS:
        raise UserError(f"{where}: kind must be one of {', '.join(random_models.KINDS)}, got {kind!r}")
    seeds = entry.get("seeds", [0, 10])
    if not (isinstance(seeds, list) and len(seeds) == 2):
        raise UserError(f"{where}: seeds must be [first, stop], got {seeds!r}")
    precisions = entry.get("precisions", default_precisions)
    optimizers = entry.get("optimizers", default_optimizers)
    _check_names(where, precisions, PRECISION_NAMES, "precision")
    _check_names(where, optimizers, OPTIMIZERS, "optimizer")
    max_params = entry.get("max_params")
    out = []
    for seed in range(*seeds):
        spec = f"random:{kind}:{seed}"
        overrides = dict(entry.get("set", {}))
        if max_params is not None and random_models.param_count(kind, seed, overrides) > max_params:
            continue
        rng = random.Random(f"{spec}:shape")
        for _ in range(entry.get("samples", 1)):
            batch = rng.choice(_list(entry.get("batch_size", [8])))
            seq = rng.choice(_list(entry.get("seq_len"))) if kind == "transformer" else None
            image = rng.choice(_list(entry.get("image_size"))) if kind == "cnn" else None
            for optimizer in optimizers:
                for precision in precisions:
                    out.append({"spec": spec, "set": overrides, "task": None, "batch_size": batch,
                                "seq_len": seq, "image_size": image, "precision": precision,
                                "optimizer": optimizer})
    return out


def format_plan(cfg) -> str:
    """``collect --dry-run``: what a grid holds, by tier and family, with model sizes, the [[skip]] rules'
    verdicts on the installed torch, and what the output folder already holds. Measures nothing."""
    from collections import Counter, defaultdict

    import torch

    from gnn_ptp import records
    from gnn_ptp.spec import ModelSpec, Shape, build, family_of, human_count

    name, configs = load_grid(cfg.grid)
    out = Path(cfg.out)
    held = {r.get("key"): r.get("status") for r in records.iter_records(out)} if out.exists() else {}
    hardware = out.name
    by_tier: dict[int, Counter] = defaultdict(Counter)
    families: dict[str, set] = defaultdict(set)
    sizes: dict[tuple, int] = {}
    status = Counter()
    for c in configs:
        spec = ModelSpec.from_dict(c)
        family = family_of(spec)
        by_tier[c["tier"]][family] += 1
        families[family].add(c["precision"])
        model = (c["spec"], tuple(sorted((k, repr(v)) for k, v in (c.get("set") or {}).items())))  # lists too
        if model not in sizes and not c["spec"].startswith("random:"):
            shape = Shape(c["batch_size"], c.get("seq_len"), c.get("image_size"))
            sizes[model] = build(spec, shape, "meta").param_count
        key = records.config_key(c, hardware)
        status[held.get(key) or ("skip rule" if "_skip" in c else "to measure")] += 1
    lines = [f"grid {name} ({cfg.grid}): {len(configs)} configurations, torch {torch.__version__}",
             f"folder {out}: " + ", ".join(f"{n} {s}" for s, n in status.most_common())]
    for tier in sorted(by_tier):
        randoms = len({c["spec"] for c in configs if c["tier"] == tier and c["spec"].startswith("random:")})
        lines.append(f"tier {tier}: {sum(by_tier[tier].values())} configurations, {len(by_tier[tier])} families, "
                     f"{randoms} random architectures")
    lines.append("models: " + ", ".join(f"{spec}{'*' if sets else ''} {human_count(n)}"
                                         for (spec, sets), n in sizes.items()) + "   (* with --set overrides)")
    incomplete = [f for f, precs in families.items() if len(precs) < 6]
    lines.append(f"families: {len(families)}; every one in all six precision classes"
                 if not incomplete else f"families missing precision classes: {', '.join(incomplete)}")
    rules = Counter(c["_skip"][:90] for c in configs if "_skip" in c)
    for reason, n in rules.items():
        lines.append(f"skip rule ({n} configurations): {reason}...")
    return "\n".join(lines)
