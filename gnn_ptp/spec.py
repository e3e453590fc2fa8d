"""Model specs: one grammar, shared by every command, for naming the model whose training step we study.

    hf:<model_type>                 a transformers architecture from its config defaults (random weights)
    hf:<path/to/config.json>        the class named in the config's ``architectures`` field
    torchvision:<name>              a torchvision classification model (optional extra)
    timm:<name>                     a timm model (optional extra)
    py:<file.py>:<factory>          your own model, see ``build_py`` for the factory's contract
    random:<kind>:<seed>            a random but plausible architecture (transformer, cnn, mlp), for data

``--set key=value`` overrides a config field (hf), a constructor keyword (torchvision, timm) or a
generated hyperparameter (random). Nothing is ever downloaded: weights are random.

A ``Workload`` is what the tracer and the collector need: the model, one example batch (inputs already
on the device) and the loss function that turns the model's output into a scalar.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gnn_ptp.errors import UserError, closest, first_line, one_line, user_code_error
from gnn_ptp.limits import LIMITS

SOURCES = ("hf", "torchvision", "timm", "py", "random")
HF_TASKS = ("causal-lm", "masked-lm", "seq2seq-lm", "sequence-classification", "image-classification")
DEFAULT_SEQ_LEN = 512
DEFAULT_IMAGE_SIZE = 224


@dataclass(frozen=True)
class ModelSpec:
    """A model named by the spec grammar, plus its overrides. Hashable and JSON-friendly."""

    spec: str
    overrides: tuple[tuple[str, Any], ...] = ()
    task: str | None = None

    @property
    def source(self) -> str:
        return self.spec.split(":", 1)[0]

    @property
    def name(self) -> str:
        return self.spec.split(":", 1)[1] if ":" in self.spec else ""

    def to_dict(self) -> dict:
        return {"spec": self.spec, "set": dict(self.overrides), "task": self.task}

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        return parse_spec(d["spec"], d.get("set") or {}, d.get("task"))

    def __str__(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.overrides)
        return self.spec + extra + (f" task={self.task}" if self.task else "")


@dataclass(frozen=True)
class Shape:
    """Input shape of one training step. seq_len applies to text models, image_size to vision models."""

    batch_size: int
    seq_len: int | None = None
    image_size: int | None = None

    def __post_init__(self):
        for name in ("batch_size", "seq_len", "image_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 1 <= value <= LIMITS[name]):
                raise UserError(f"--{name.replace('_', '-')} {value!r} is out of range: allowed an integer "
                                f"from 1 to {LIMITS[name]}")


@dataclass
class Workload:
    model: nn.Module
    args: tuple = ()
    """Positional inputs of ``model(...)``."""
    kwargs: dict = field(default_factory=dict)
    """Keyword inputs of ``model(...)``."""
    targets: dict = field(default_factory=dict)
    """Tensors the loss needs besides the model's output (e.g. labels)."""
    loss_fn: Callable[..., torch.Tensor] = None
    """``loss_fn(output, **targets)``: the scalar loss."""
    family: str = ""
    """Architecture family, for splits that hold whole families out."""
    modality: str = "text"
    """text, vision or tabular: which of seq_len and image_size the shape uses."""
    shape: Shape | None = None
    """The shape actually used, defaults filled in."""

    @property
    def param_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def parse_value(text: str) -> Any:
    """``--set`` values: JSON where it parses (24, 0.1, true, null, [1,2]), else the plain string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _frozen(value):
    """Lists become tuples so that a spec can key a cache (``depths=[2, 2]``)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


def _thawed(value):
    """The inverse of ``_frozen`` for handing overrides to constructors: tuples back to lists."""
    if isinstance(value, dict):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


def parse_overrides(items: list[str] | dict | None) -> tuple[tuple[str, Any], ...]:
    if not items:
        return ()
    if isinstance(items, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in items.items()))
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r} is not key=value (e.g. --set num_hidden_layers=24)")
        out[key.strip()] = _frozen(parse_value(value.strip()))
    return tuple(sorted(out.items()))


def parse_spec(spec: str, overrides=None, task: str | None = None) -> ModelSpec:
    source, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise UserError(f"model spec {spec!r} is not <source>:<name>; sources: {', '.join(SOURCES)}"
                        " (e.g. hf:gpt2, torchvision:resnet50, py:model.py:make)")
    if source not in SOURCES:
        raise UserError(f"unknown model source {source!r} in {spec!r}; allowed: {', '.join(SOURCES)}"
                        + closest(source, SOURCES))
    if task is not None and task not in HF_TASKS:
        raise UserError(f"unknown task {task!r}; allowed: {', '.join(HF_TASKS)}" + closest(task, HF_TASKS))
    if task is not None and source != "hf":
        raise UserError(f"--task applies to hf: specs only, not {spec!r}")
    return ModelSpec(spec, parse_overrides(overrides), task)


def build(spec: ModelSpec, shape: Shape, device: torch.device | str = "meta",
          param_dtype: torch.dtype = torch.float32) -> Workload:
    """Build the model and one example batch on ``device`` (``meta`` for tracing: no memory)."""
    device = torch.device(device)
    builder = {"hf": build_hf, "torchvision": build_torchvision, "timm": build_timm,
               "py": build_py, "random": build_random}[spec.source]
    try:
        with torch.device(device):
            workload = builder(spec, shape)
    except (NotImplementedError, RuntimeError) as e:
        if device.type != "meta" or "meta" not in str(e):
            raise
        # a constructor that reads tensor values (torchvision's RegNet computes its widths from
        # tensors): build on the CPU for real, then drop the storage
        with torch.device("cpu"):
            workload = builder(spec, shape)
        workload.model.to("meta")
        to_meta = lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x  # noqa: E731
        workload.args = tuple(to_meta(a) for a in workload.args)
        workload.kwargs = {k: to_meta(v) for k, v in workload.kwargs.items()}
        workload.targets = {k: to_meta(v) for k, v in workload.targets.items()}
    workload.model.train()
    if param_dtype != torch.float32:
        workload.model.to(param_dtype)
        workload.args = tuple(_cast_floats(a, param_dtype) for a in workload.args)
        workload.kwargs = {k: _cast_floats(v, param_dtype) for k, v in workload.kwargs.items()}
        workload.targets = {k: _cast_floats(v, param_dtype) for k, v in workload.targets.items()}
    return workload


def _cast_floats(x, dtype):
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


# ----------------------------------------------------------------------------------------------------
# Families: the unit that evaluation holds out. Near-identical architectures share one family so that a
# held-out family is really unseen (Llama, Qwen2 and Mistral differ by little more than their sizes).

FAMILY_OF = {
    "llama": "llama", "qwen2": "llama", "mistral": "llama", "qwen3": "llama", "gemma": "llama",
    "gemma2": "llama", "phi3": "llama", "olmo": "llama",
    "bert": "bert", "roberta": "bert", "distilbert": "bert", "electra": "bert", "xlm-roberta": "bert",
    "gpt2": "gpt2", "gpt_neo": "gpt2", "gptj": "gpt2",
    "t5": "t5", "mt5": "t5", "bart": "bart",
    "opt": "opt",
    "vit": "vit", "deit": "vit", "beit": "vit",
    "swin": "swin", "swinv2": "swin",
    "resnet": "resnet", "resnext": "resnet", "wide_resnet": "resnet",
    "convnext": "convnext", "convnext_v2": "convnext",
}
_VISION_PREFIXES = ("resnext", "wide_resnet", "resnet", "vgg", "densenet", "mobilenet", "efficientnet",
                    "convnext", "regnet", "vit", "swin", "squeezenet", "shufflenet", "mnasnet",
                    "googlenet", "inception", "alexnet", "maxvit", "deit", "beit")


def family_of(spec: ModelSpec, model_type: str | None = None) -> str:
    if spec.source == "random":
        return "random-" + spec.name.split(":")[0]
    if spec.source == "py":
        return "custom-" + spec.name.rsplit(":", 1)[-1]
    name = (model_type or spec.name).lower()
    if name in FAMILY_OF:
        return FAMILY_OF[name]
    for prefix in _VISION_PREFIXES:
        if name.startswith(prefix):
            return FAMILY_OF.get(prefix, prefix)
    return re.split(r"[_\-.\d]", name)[0] or name


# ----------------------------------------------------------------------------------------------------
# Hugging Face transformers


def _hf_config(spec: ModelSpec):
    import transformers

    transformers.logging.set_verbosity_error()  # config chatter ("loss_type=None ...") is not news

    name = spec.name
    overrides = dict(spec.overrides)
    attn = overrides.pop("attn_implementation", None)
    if name.endswith(".json") or "/" in name or Path(name).is_dir():
        path = Path(name)
        if path.is_dir():  # a model folder, as transformers saves one: its config.json
            if not (path / "config.json").is_file():
                raise UserError(f"folder {name!r} (from {spec.spec!r}) has no config.json; give a model "
                                "folder holding one, or the path of a config .json file")
            path = path / "config.json"
        elif not path.is_file():
            raise UserError(f"config file {name!r} (from {spec.spec!r}) does not exist")
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise UserError(f"config file {str(path)!r} is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise UserError(f"config file {str(path)!r} holds {type(data).__name__}, not a JSON object")
        model_type = data.pop("model_type", None)
        if model_type not in transformers.CONFIG_MAPPING:
            raise UserError(f"config file {str(path)!r} has model_type {model_type!r}, which this "
                            f"transformers {transformers.__version__} does not know"
                            + closest(str(model_type), transformers.CONFIG_MAPPING.keys()))
    else:
        if name not in transformers.CONFIG_MAPPING:
            raise UserError(f"unknown model {spec.spec!r}: no transformers model_type {name!r}"
                            + closest(name, transformers.CONFIG_MAPPING.keys()))
        model_type, data = name, {}
    try:
        default = transformers.AutoConfig.for_model(model_type, **data)
    except Exception as e:  # transformers validates field types and values as it builds the config
        raise UserError(f"config file {name!r}: transformers refuses it: {_config_error(e)}") from None
    known = (set(default.to_dict()) | set(getattr(default, "attribute_map", {}))
             | {k for k in dir(type(default)) if isinstance(getattr(type(default), k, None), property)})
    for key in overrides:
        if key not in known:
            raise UserError(f"--set {key}: {default.model_type} configs have no field {key!r}"
                            + closest(key, known))
    # through the constructor, so that fields derived from an override follow it (Llama's head_dim
    # from hidden_size / num_attention_heads)
    given = " ".join(f"--set {k}={json.dumps(v) if not isinstance(v, str) else v}"
                     for k, v in _thawed(overrides).items())
    try:
        config = transformers.AutoConfig.for_model(model_type, **{**data, **_thawed(overrides)})
        for key, value in _thawed(overrides).items():
            if getattr(config, key, None) != value:
                setattr(config, key, value)
    except Exception as e:  # strict dataclass validation: "Field 'n_layer' expected int, got str"
        raise UserError(f"{given}: {default.model_type} {_config_error(e)} "
                        f"(the config's default for it: {_default_of(default, one_line(e))})") from None
    if attn is not None:
        allowed = ("sdpa", "eager", "flash_attention_2")
        if attn not in allowed:
            raise UserError(f"--set attn_implementation={attn}: allowed: {', '.join(allowed)}")
        config._attn_implementation = attn
    return config


def _config_error(e: Exception) -> str:
    """transformers' config validation error on one line: "Field 'n_layer' expected int, got str"."""
    why = one_line(e)
    m = re.search(r"(Field '[^']+' expected [^(]+)", why)
    return m.group(1).strip() if m else why[:300]


def _default_of(default, why: str) -> str:
    m = re.search(r"field '([^']+)'", why, re.IGNORECASE)
    return repr(getattr(default, m.group(1), None)) if m else "see its documentation"


def _hf_task(config, task: str | None) -> tuple[str, type]:
    import transformers
    from transformers.models.auto import modeling_auto as auto

    mappings = {
        "causal-lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "masked-lm": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "seq2seq-lm": auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "sequence-classification": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "image-classification": auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
    }
    mt = config.model_type
    archs = getattr(config, "architectures", None)
    if task is None and archs:
        cls = getattr(transformers, archs[0], None)
        if cls is None:
            raise UserError(f"config names architecture {archs[0]!r}, which transformers does not have")
        for t, mapping in mappings.items():
            if mapping.get(mt) == archs[0]:
                return t, cls
        return _task_from_class_name(archs[0]), cls
    if task is None:
        order = (["seq2seq-lm"] if getattr(config, "is_encoder_decoder", False) else []) + [
            "image-classification", "masked-lm", "causal-lm", "sequence-classification"]
        for t in order:
            if mt in mappings[t]:
                task = t
                break
        else:
            raise UserError(f"hf:{mt} has no training head gnn-ptp knows; pass --task "
                            f"({', '.join(HF_TASKS)})")
    if mt not in mappings[task]:
        have = [t for t, m in mappings.items() if mt in m]
        raise UserError(f"hf:{mt} has no {task} head; it has: {', '.join(have) or 'none'}")
    return task, getattr(transformers, mappings[task][mt])


def _task_from_class_name(cls_name: str) -> str:
    for suffix, task in (("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"),
                         ("ForMaskedLM", "masked-lm"), ("ForConditionalGeneration", "seq2seq-lm"),
                         ("ForSequenceClassification", "sequence-classification"),
                         ("ForImageClassification", "image-classification")):
        if cls_name.endswith(suffix):
            return task
    raise UserError(f"architecture {cls_name!r} has no training head gnn-ptp knows; "
                    f"use a *ForCausalLM, *ForMaskedLM, *ForConditionalGeneration, "
                    f"*ForSequenceClassification or *ForImageClassification class")


def build_hf(spec: ModelSpec, shape: Shape) -> Workload:
    config = _hf_config(spec)
    task, cls = _hf_task(config, spec.task)
    if task == "image-classification" and shape.image_size and hasattr(config, "image_size"):
        config.image_size = shape.image_size  # ViT-style models check the input size against it
    if task == "sequence-classification" and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = 0  # GPT-style models refuse batches > 1 without one
    if task == "seq2seq-lm" and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0  # shifts labels right
    model = cls._from_config(config) if hasattr(cls, "_from_config") else cls(config)
    family = family_of(spec, config.model_type)
    b = shape.batch_size
    if task == "image-classification":
        size = shape.image_size or getattr(config, "image_size", DEFAULT_IMAGE_SIZE)
        if isinstance(size, (list, tuple)):
            size = size[0]
        channels = getattr(config, "num_channels", 3)
        kwargs = {"pixel_values": torch.randn(b, channels, size, size),
                  "labels": torch.randint(0, config.num_labels, (b,))}
        return Workload(model, (), kwargs, {}, _hf_loss, family, "vision", Shape(b, None, size))
    seq = shape.seq_len or DEFAULT_SEQ_LEN
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    # RoBERTa-style embeddings number positions from pad_token_id + 1: seq_len + pad + 1 rows are needed
    # (on a GPU a longer sequence is a device-side assert that kills the process, not an exception).
    offset = _position_offset(model, config)
    if limit and seq + offset > limit:
        need = f"{seq} + {offset} (positions start after pad_token_id)" if offset else f"{seq}"
        raise UserError(f"--seq-len {seq} needs {need} position embeddings, more than hf:{config.model_type}'s "
                        f"max_position_embeddings ({limit}); lower it or --set max_position_embeddings=...")
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (b, seq))
    if task in ("causal-lm", "masked-lm", "seq2seq-lm"):
        kwargs = {"input_ids": ids, "labels": torch.randint(0, vocab, (b, seq))}
    else:
        kwargs = {"input_ids": ids, "labels": torch.randint(0, config.num_labels, (b,))}
    return Workload(model, (), kwargs, {}, _hf_loss, family, "text", Shape(b, seq, None))


def _position_offset(model, config) -> int:
    """Rows of the position table before the first position: pad_token_id + 1 where the embeddings number
    positions after the padding index (RoBERTa, XLM-R, CamemBERT...), else 0."""
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        return 0
    for module in model.modules():
        if hasattr(module, "create_position_ids_from_input_ids") and hasattr(module, "position_embeddings"):
            return int(pad) + 1
    return 0


def _hf_loss(output) -> torch.Tensor:
    return output.loss


# ----------------------------------------------------------------------------------------------------
# torchvision and timm classifiers: images in, cross-entropy against random labels.


def _classifier_workload(model, spec, shape, num_classes, family) -> Workload:
    size = shape.image_size or DEFAULT_IMAGE_SIZE
    images = torch.randn(shape.batch_size, 3, size, size)
    labels = torch.randint(0, num_classes, (shape.batch_size,))
    return Workload(model, (images,), {}, {"labels": labels}, classifier_loss, family, "vision",
                    Shape(shape.batch_size, None, size))


def classifier_loss(output, labels):
    if isinstance(output, (tuple, list)):  # inception/googlenet aux outputs in training mode
        output = output[0]
    output = getattr(output, "logits", output)
    return nn.functional.cross_entropy(output.flatten(0, -2), labels.flatten())


def _require(package: str, spec: ModelSpec):
    if importlib.util.find_spec(package) is None:
        raise UserError(f"{spec.spec!r} needs the {package} package, which is not installed; "
                        f"install it with: pip install 'gnn-ptp[vision]'")


def build_torchvision(spec: ModelSpec, shape: Shape) -> Workload:
    _require("torchvision", spec)
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models)
    if spec.name not in names:
        raise UserError(f"unknown model {spec.spec!r}" + closest(spec.name, names))
    kwargs = dict(spec.overrides)
    size = shape.image_size or DEFAULT_IMAGE_SIZE
    if spec.name.startswith("vit_"):
        kwargs.setdefault("image_size", size)
    if spec.name in ("inception_v3", "googlenet"):
        kwargs.setdefault("init_weights", True)
    try:
        model = torchvision.models.get_model(spec.name, weights=None, **kwargs)
    except TypeError as e:
        raise UserError(f"--set for {spec.spec!r}: {e}") from None
    num_classes = kwargs.get("num_classes", 1000)
    return _classifier_workload(model, spec, shape, num_classes, family_of(spec))


def build_timm(spec: ModelSpec, shape: Shape) -> Workload:
    _require("timm", spec)
    import timm

    if not timm.is_model(spec.name):
        raise UserError(f"unknown model {spec.spec!r}" + closest(spec.name, timm.list_models()))
    kwargs = dict(spec.overrides)
    if shape.image_size is not None:
        kwargs.setdefault("img_size", shape.image_size)
    try:
        model = timm.create_model(spec.name, pretrained=False, **kwargs)
    except TypeError:
        kwargs.pop("img_size", None)  # CNNs take any size and no img_size keyword
        model = timm.create_model(spec.name, pretrained=False, **kwargs)
    return _classifier_workload(model, spec, shape, model.num_classes, family_of(spec))


# ----------------------------------------------------------------------------------------------------
# py:<file.py>:<factory>


def build_py(spec: ModelSpec, shape: Shape) -> Workload:
    """Build a user's model from ``py:<file.py>:<factory>``.

    The factory's contract::

        def factory(batch_size: int, seq_len: int | None, image_size: int | None, **overrides):
            model = MyModel(...)                               # no .to(device): gnn-ptp picks it
            inputs = {"x": torch.randn(batch_size, 64)}        # model(**inputs); a tuple: model(*inputs)
            targets = {"y": torch.randint(0, 10, (batch_size,))}  # what the loss needs besides the output
            def loss_fn(output, y):                             # returns a scalar tensor
                return torch.nn.functional.cross_entropy(output, y)
            return model, inputs, targets, loss_fn

    (``return model, inputs, loss_fn`` is fine when the loss needs nothing but the output.)
    gnn-ptp calls the factory inside ``with torch.device(...)``, so tensors and parameters created
    without an explicit device land on the right one (``meta`` when tracing, ``cuda`` when measuring);
    ``--set key=value`` pairs arrive as keyword arguments. The loss must not capture tensors in a
    closure: pass them as targets.
    """
    file_name, sep, factory_name = spec.name.rpartition(":")
    if not sep or not file_name.endswith(".py"):
        raise UserError(f"{spec.spec!r} is not py:<file.py>:<factory>")
    path = Path(file_name)
    if not path.is_file():
        raise UserError(f"model file {file_name!r} (from {spec.spec!r}) does not exist")
    module_spec = importlib.util.spec_from_file_location(f"gnn_ptp_user_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as e:
        raise UserError(f"{file_name}:{e.lineno}: SyntaxError: {e.msg}") from None
    except Exception as e:
        raise user_code_error(e, path, f"importing {file_name}") from e
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        names = [n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise UserError(f"{file_name} has no function {factory_name!r}" + closest(factory_name, names))
    try:
        result = factory(batch_size=shape.batch_size, seq_len=shape.seq_len, image_size=shape.image_size,
                         **dict(spec.overrides))
    except UserError:
        raise
    except TypeError as e:
        if any(Path(f.filename).resolve() == path.resolve()
               for f in __import__("traceback").extract_tb(e.__traceback__)[1:]):
            raise user_code_error(e, path, f"calling {factory_name}()") from e
        raise UserError(f"{factory_name}() in {file_name} cannot be called as factory(batch_size, seq_len, "
                        f"image_size, **overrides) with --set {sorted(dict(spec.overrides))}: {first_line(e)}") from None
    except Exception as e:
        raise user_code_error(e, path, f"calling {factory_name}()") from e
    if not (isinstance(result, tuple) and len(result) in (3, 4)):
        raise UserError(f"{factory_name}() in {file_name} must return (model, inputs, targets, loss_fn)"
                        f" or (model, inputs, loss_fn), not {_kind(result)}")
    model, inputs, targets, loss_fn = result if len(result) == 4 else (result[0], result[1], {}, result[2])
    where = f"{factory_name}() in {file_name}"
    if not isinstance(model, nn.Module):
        raise UserError(f"{where} returned {_kind(model)} as the model; it must be a torch.nn.Module")
    if not callable(loss_fn):
        raise UserError(f"{where} returned {_kind(loss_fn)} as loss_fn; it must be callable "
                        "(a function or a loss module such as torch.nn.CrossEntropyLoss())")
    if isinstance(inputs, torch.Tensor):  # one tensor is one input, not a sequence to unpack
        args, kwargs = (inputs,), {}
    elif isinstance(inputs, dict):
        args, kwargs = (), dict(inputs)
    elif isinstance(inputs, (tuple, list)):
        args, kwargs = tuple(inputs), {}
    else:
        raise UserError(f"{where} returned {_kind(inputs)} as inputs; allowed: a tensor, a tuple/list "
                        "(model(*inputs)) or a dict (model(**inputs))")
    if isinstance(targets, dict):
        targets = dict(targets)
    elif isinstance(targets, (torch.Tensor, tuple, list)) or targets is None:
        # positional targets (loss_fn(output, y), as torch.nn losses take them): named for the tracer,
        # handed back in order
        values = () if targets is None else (targets,) if isinstance(targets, torch.Tensor) else tuple(targets)
        targets = {f"target{i}": v for i, v in enumerate(values)}
        loss_fn = _PositionalLoss(loss_fn, len(values))
    else:
        raise UserError(f"{where} returned {_kind(targets)} as targets; allowed: a tensor, a tuple/list of "
                        "them (loss_fn(output, *targets)) or a dict (loss_fn(output, **targets))")
    modality = "vision" if shape.image_size and not shape.seq_len else "text"
    return Workload(model, args, kwargs, targets, loss_fn, family_of(spec), modality, shape)


def py_file(spec: ModelSpec) -> Path | None:
    """The user's file of a ``py:<file.py>:<factory>`` spec (None for other sources)."""
    return Path(spec.name.rpartition(":")[0]) if spec.source == "py" else None


def _kind(value) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


class _PositionalLoss:
    """``loss_fn(output, target0=a, target1=b)`` -> the user's ``loss_fn(output, a, b)``."""

    def __init__(self, loss_fn, n: int):
        self.loss_fn, self.n = loss_fn, n

    def __call__(self, output, **targets):
        return self.loss_fn(output, *(targets[f"target{i}"] for i in range(self.n)))


def build_random(spec: ModelSpec, shape: Shape) -> Workload:
    from gnn_ptp import random_models

    return random_models.build(spec, shape)


def human_count(n: float) -> str:
    if n < 1000:
        return f"{n:.0f}"
    exp = min(int(math.log10(n) // 3), 5)
    return f"{n / 10 ** (3 * exp):.3g}{' kMGTP'[exp]}"
