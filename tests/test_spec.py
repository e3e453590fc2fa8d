"""The model-spec grammar, --set overrides, errors a user sees, families and parameter dtypes."""

from __future__ import annotations

import json

import pytest
import torch

from gnn_ptp import random_models
from gnn_ptp.errors import UserError
from gnn_ptp.spec import (
    FAMILY_OF,
    ModelSpec,
    Shape,
    build,
    family_of,
    parse_overrides,
    parse_spec,
    parse_value,
)

from conftest import BERT, GPT2, LLAMA, PYMODELS, TEXT, VISION, spec_of


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, f"a UserError must be one line: {message!r}"
    return message


# --- grammar -------------------------------------------------------------------------------------


def test_spec_parts_and_round_trip():
    spec = parse_spec("hf:swin", ["depths=[2, 2]", "embed_dim=48", "hidden_act=gelu"])
    assert spec.source == "hf" and spec.name == "swin"
    assert dict(spec.overrides) == {"depths": (2, 2), "embed_dim": 48, "hidden_act": "gelu"}
    hash(spec)  # lists become tuples: a spec keys the trace cache
    again = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert parse_spec("py:/a/b/model.py:make").name == "/a/b/model.py:make"


def test_hf_model_type(gpt2_spec):
    w = build(gpt2_spec, TEXT)
    assert type(w.model).__name__ == "GPT2LMHeadModel"
    assert w.model.config.n_layer == 1 and w.model.config.n_embd == 64 and w.model.config.vocab_size == 500
    assert w.family == "gpt2" and w.modality == "text"
    assert w.shape == Shape(2, 16, None)
    assert w.kwargs["input_ids"].shape == (2, 16) and w.kwargs["labels"].shape == (2, 16)
    assert all(p.device.type == "meta" for p in w.model.parameters())  # tracing needs no memory
    assert w.model.training


def test_hf_default_seq_len(bert_spec):
    w = build(bert_spec, Shape(2))
    assert w.shape.seq_len == 512
    assert type(w.model).__name__ == "BertForMaskedLM"


def test_hf_task_override(bert_spec):
    w = build(parse_spec(bert_spec.spec, dict(bert_spec.overrides), "sequence-classification"), TEXT)
    assert type(w.model).__name__ == "BertForSequenceClassification"
    assert w.kwargs["labels"].shape == (2,)


def test_hf_config_json_uses_architectures(tmp_path):
    config = {"model_type": "bert", "architectures": ["BertForSequenceClassification"],
              "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
              "intermediate_size": 64, "vocab_size": 300, "num_labels": 3}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    w = build(parse_spec(f"hf:{path}"), TEXT)
    assert type(w.model).__name__ == "BertForSequenceClassification"
    assert w.model.config.hidden_size == 32 and w.model.config.num_labels == 3
    assert w.kwargs["labels"].shape == (2,)
    assert w.family == "bert"
    # --set still applies on top of the file
    w = build(parse_spec(f"hf:{path}", ["num_hidden_layers=2"]), TEXT)
    assert w.model.config.num_hidden_layers == 2


def test_hf_config_json_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist") as e:
        build(parse_spec(f"hf:{tmp_path}/missing.json"), TEXT)
    one_line_error(e)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        build(parse_spec(f"hf:{bad}"), TEXT)
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"model_type": "no_such_model"}))
    with pytest.raises(UserError, match="no_such_model"):
        build(parse_spec(f"hf:{unknown}"), TEXT)


def test_torchvision():
    w = build(parse_spec("torchvision:resnet18", ["num_classes=7"]), VISION)
    assert type(w.model).__name__ == "ResNet"
    assert w.args[0].shape == (2, 3, 32, 32) and w.modality == "vision"
    assert w.model.fc.out_features == 7
    assert w.family == "resnet"
    assert build(parse_spec("torchvision:resnet18"), Shape(2)).shape.image_size == 224


def test_torchvision_bad_keyword_is_user_error():
    with pytest.raises(UserError, match="torchvision:resnet18") as e:
        build(parse_spec("torchvision:resnet18", ["no_such_kwarg=1"]), VISION)
    one_line_error(e)


def test_timm():
    pytest.importorskip("timm")
    w = build(parse_spec("timm:resnet18", ["num_classes=5"]), VISION)
    assert w.model.num_classes == 5 and w.args[0].shape == (2, 3, 32, 32)
    # a ViT takes the image size as img_size
    vit = build(parse_spec("timm:vit_tiny_patch16_224"), VISION)
    assert vit.model.patch_embed.img_size == (32, 32)
    assert vit.family == "vit"


def test_py_four_tuple():
    w = build(parse_spec(f"py:{PYMODELS}:mlp2", ["hidden=12"]), Shape(3))
    assert w.model[0].out_features == 12  # --set arrives as a keyword
    assert len(w.args) == 1 and w.args[0].shape == (3, 24) and w.kwargs == {}
    assert set(w.targets) == {"y"}
    assert w.family == "custom-mlp2"
    assert w.args[0].device.type == "meta"  # built inside `with torch.device(...)`
    out = torch.zeros(3, 8)
    assert w.loss_fn(out, y=torch.ones(3, 8)).item() == pytest.approx(1.0)


def test_py_three_tuple():
    w = build(parse_spec(f"py:{PYMODELS}:mlp2_three"), Shape(3))
    assert w.args == () and set(w.kwargs) == {"input"} and w.targets == {}
    assert w.loss_fn(torch.full((3, 8), 2.0)).item() == pytest.approx(4.0)


def test_py_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        build(parse_spec(f"py:{tmp_path}/nope.py:make"), Shape(2))
    with pytest.raises(UserError, match="did you mean 'mlp2'") as e:
        build(parse_spec(f"py:{PYMODELS}:mlp3"), Shape(2))
    one_line_error(e)
    with pytest.raises(UserError, match="must return"):
        build(parse_spec(f"py:{PYMODELS}:not_a_tuple"), Shape(2))
    with pytest.raises(UserError, match="py:<file.py>:<factory>"):
        build(parse_spec("py:model_without_factory"), Shape(2))


def test_random_is_deterministic():
    for kind, shape in (("mlp", Shape(2)), ("cnn", Shape(2, None, 32)), ("transformer", Shape(2, 16))):
        spec = parse_spec(f"random:{kind}:5")
        a, b = build(spec, shape), build(spec, shape)
        assert [p.shape for p in a.model.parameters()] == [p.shape for p in b.model.parameters()]
        assert random_models.arch_for(kind, 5, {}) == random_models.arch_for(kind, 5, {})
        # param_count (for the grid's max_params filter) builds transformers with max_len=1: the learned
        # position table depends on seq_len and is left out
        pos = (shape.seq_len - 1) * a.model.a.d_model if kind == "transformer" else 0
        assert a.param_count - pos == random_models.param_count(kind, 5, {})
        assert a.family == f"random-{kind}"
    # different seeds give different architectures (for these seeds)
    archs = {random_models.arch_for("transformer", s, {}) for s in range(5)}
    assert len(archs) == 5


def test_random_set_overrides():
    w = build(parse_spec("random:mlp:1", ["width=16", "depth=2", "norm=none"]), Shape(2))
    assert w.model.net[0].out_features == 16
    assert random_models.arch_for("mlp", 1, {"width": 16}).width == 16
    with pytest.raises(UserError, match="d_model .* not divisible"):
        build(parse_spec("random:transformer:0", ["d_model=100", "heads=3"]), Shape(2, 8))


# --- --set ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, value", [
    ("24", 24), ("0.1", 0.1), ("true", True), ("null", None), ("[1, 2]", [1, 2]),
    ("gelu", "gelu"), ('"quoted"', "quoted"), ("1e-5", 1e-5),
])
def test_parse_value(text, value):
    assert parse_value(text) == value


def test_parse_overrides():
    assert parse_overrides(["b=2", "a = x", "c=[1,2]"]) == (("a", "x"), ("b", 2), ("c", (1, 2)))
    assert parse_overrides({"z": [1], "y": 1}) == (("y", 1), ("z", (1,)))
    assert parse_overrides(None) == ()
    for bad in ("n_layer", "=3"):
        with pytest.raises(UserError, match="not key=value"):
            parse_overrides([bad])


def test_unknown_set_field_suggests(gpt2_spec):
    with pytest.raises(UserError, match="did you mean 'n_layer'") as e:
        build(parse_spec("hf:gpt2", ["n_layr=1"]), TEXT)
    assert "n_layr" in one_line_error(e)
    with pytest.raises(UserError, match="did you mean 'width'") as e:
        build(parse_spec("random:mlp:0", ["widht=3"]), Shape(2))
    one_line_error(e)


def test_attn_implementation_override():
    w = build(spec_of(GPT2, "attn_implementation=eager"), TEXT)
    assert w.model.config._attn_implementation == "eager"
    with pytest.raises(UserError, match="attn_implementation"):
        build(spec_of(GPT2, "attn_implementation=magic"), TEXT)


# --- errors that name the closest valid choice ------------------------------------------------------


@pytest.mark.parametrize("spec, shape, expect", [
    ("hff:gpt2", None, "did you mean 'hf'"),
    ("gpt2", None, "not <source>:<name>"),
    ("hf:gpt3", TEXT, "'gpt2'"),
    ("torchvision:resnet19", VISION, "'resnet18'"),
    ("random:mlpp:1", Shape(2), "did you mean 'mlp'"),
    ("random:mlp:x", Shape(2), "seed must be an integer"),
])
def test_wrong_names(spec, shape, expect):
    with pytest.raises(UserError) as e:
        build(parse_spec(spec), shape) if shape else parse_spec(spec)
    message = one_line_error(e)
    assert expect in message
    assert spec.split(":")[0] in message  # the message names what the user typed


def test_timm_wrong_name():
    pytest.importorskip("timm")
    with pytest.raises(UserError, match="'resnet18'") as e:
        build(parse_spec("timm:resnet19"), VISION)
    one_line_error(e)


def test_wrong_task():
    with pytest.raises(UserError, match="did you mean 'causal-lm'"):
        parse_spec("hf:gpt2", task="causal")
    with pytest.raises(UserError, match="hf: specs only"):
        parse_spec("torchvision:resnet18", task="causal-lm")
    with pytest.raises(UserError, match="no image-classification head"):
        build(parse_spec("hf:gpt2", ["n_layer=1"], "image-classification"), TEXT)


def test_seq_len_longer_than_positions():
    with pytest.raises(UserError, match="max_position_embeddings \\(1024\\)") as e:
        build(spec_of(GPT2), Shape(1, 2048))
    one_line_error(e)
    with pytest.raises(UserError, match="512"):
        build(spec_of(BERT), Shape(1, 513))
    # raising the limit with --set makes it legal
    w = build(spec_of(GPT2, "n_positions=2048"), Shape(1, 2048))
    assert w.shape.seq_len == 2048


def test_shape_validation():
    with pytest.raises(UserError, match="--batch-size"):
        Shape(0)
    with pytest.raises(UserError, match="--seq-len"):
        Shape(1, -3)


# --- families ------------------------------------------------------------------------------------


def test_family_grouping():
    fam = lambda s: family_of(parse_spec(s))  # noqa: E731
    assert fam("hf:llama") == fam("hf:qwen2") == fam("hf:mistral") == "llama"
    assert fam("hf:bert") == fam("hf:roberta") == fam("hf:distilbert") == "bert"
    assert fam("torchvision:resnet50") == fam("torchvision:wide_resnet50_2") == fam("timm:resnext50_32x4d")
    assert fam("torchvision:resnet50") == "resnet"
    assert fam("timm:convnext_tiny") == "convnext"
    assert fam("random:cnn:3") == "random-cnn"
    assert fam(f"py:{PYMODELS}:mlp2") == "custom-mlp2"
    assert fam("hf:gpt2") != fam("hf:llama")
    assert set(FAMILY_OF.values()) >= {"llama", "bert", "gpt2", "t5", "vit", "resnet"}


def test_family_from_config_model_type(llama_spec):
    assert build(llama_spec, TEXT).family == "llama"
    assert family_of(parse_spec("hf:/some/path/config.json"), "qwen2") == "llama"


# --- parameter dtype -----------------------------------------------------------------------------


def test_param_dtype_bf16_vision():
    w = build(parse_spec("torchvision:resnet18"), VISION, param_dtype=torch.bfloat16)
    assert {p.dtype for p in w.model.parameters()} == {torch.bfloat16}
    assert w.args[0].dtype == torch.bfloat16  # float inputs follow the parameters
    assert w.targets["labels"].dtype == torch.int64  # integer labels do not
    assert torch.bfloat16 in {b.dtype for b in w.model.buffers()}


def test_param_dtype_bf16_text(gpt2_spec):
    w = build(gpt2_spec, TEXT, param_dtype=torch.bfloat16)
    assert {p.dtype for p in w.model.parameters()} == {torch.bfloat16}
    assert w.kwargs["input_ids"].dtype == torch.int64
    w32 = build(gpt2_spec, TEXT)
    assert {p.dtype for p in w32.model.parameters()} == {torch.float32}


def test_llama_gqa_config(llama_spec):
    w = build(llama_spec, TEXT)
    attn = w.model.model.layers[0].self_attn
    assert attn.q_proj.out_features == 64 and attn.k_proj.out_features == 32  # 4 q heads, 2 kv heads
    assert spec_of(LLAMA) == llama_spec


def test_set_overrides_rederive_dependent_config_fields():
    w = build(parse_spec("hf:llama", ["num_hidden_layers=1", "hidden_size=64", "intermediate_size=128",
                                      "num_attention_heads=4", "num_key_value_heads=2", "vocab_size=500"]), TEXT)
    assert w.model.config.head_dim == 16
    assert w.model.model.layers[0].self_attn.q_proj.out_features == 64


def test_roberta_positions_start_after_the_padding_id_so_the_table_needs_two_more_rows():
    """RoBERTa numbers positions from pad_token_id + 1: at the config default of 512 rows, a 512-token
    sequence indexes past the table. On a GPU that is a device-side assert that kills the collector (it
    ended the first H200 harvest slice), so the spec refuses it up front."""
    from gnn_ptp.spec import Shape, build, parse_spec

    with pytest.raises(UserError, match=r"512 \+ 2 .*max_position_embeddings \(512\)"):
        build(parse_spec("hf:roberta"), Shape(2, 512, None), "meta")
    assert build(parse_spec("hf:roberta"), Shape(2, 510, None), "meta").param_count > 0
    assert build(parse_spec("hf:roberta", ["max_position_embeddings=514"]), Shape(2, 512, None), "meta")
    assert build(parse_spec("hf:bert"), Shape(2, 512, None), "meta")  # BERT counts from 0: 512 fit
