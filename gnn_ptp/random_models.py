"""Random but plausible architectures, for giving the predictor variety it cannot get from the zoo.

``random:<kind>:<seed>`` names one architecture: the seed fixes every hyperparameter, so a record that
holds the spec can rebuild exactly the model it measured. ``--set field=value`` overrides any field of
the kind's dataclass (e.g. ``--set depth=4``).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from gnn_ptp.errors import UserError, closest

KINDS = ("transformer", "cnn", "mlp")
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}


@dataclass(frozen=True)
class TransformerArch:
    vocab_size: int
    d_model: int
    depth: int
    heads: int
    ffn_mult: float
    gated: bool
    act: str
    norm: str
    causal: bool
    tie_embeddings: bool
    dropout: float
    classify: bool

    @classmethod
    def sample(cls, rng: random.Random) -> "TransformerArch":
        head_dim = rng.choice([32, 64, 64, 128])
        heads = rng.choice([2, 4, 6, 8, 12, 16])
        return cls(
            vocab_size=rng.choice([1000, 8192, 32000, 50257]),
            d_model=head_dim * heads,
            depth=rng.randint(1, 12),
            heads=heads,
            ffn_mult=rng.choice([2.0, 8 / 3, 4.0]),
            gated=rng.random() < 0.4,
            act=rng.choice(["gelu", "silu", "relu"]),
            norm=rng.choice(["layernorm", "rmsnorm"]),
            causal=rng.random() < 0.6,
            tie_embeddings=rng.random() < 0.5,
            dropout=rng.choice([0.0, 0.0, 0.1]),
            classify=rng.random() < 0.25,
        )


@dataclass(frozen=True)
class CNNArch:
    stages: int
    blocks_per_stage: int
    base_width: int
    growth: float
    kernel: int
    depthwise: bool
    residual: bool
    norm: str
    act: str
    num_classes: int

    @classmethod
    def sample(cls, rng: random.Random) -> "CNNArch":
        return cls(
            stages=rng.randint(2, 5),
            blocks_per_stage=rng.randint(1, 3),
            base_width=rng.choice([16, 24, 32, 48, 64, 96]),
            growth=rng.choice([1.5, 2.0]),
            kernel=rng.choice([3, 3, 5, 7]),
            depthwise=rng.random() < 0.3,
            residual=rng.random() < 0.6,
            norm=rng.choice(["batch", "batch", "group", "none"]),
            act=rng.choice(["relu", "gelu", "silu"]),
            num_classes=rng.choice([10, 100, 1000]),
        )


@dataclass(frozen=True)
class MLPArch:
    in_features: int
    depth: int
    width: int
    act: str
    norm: str
    dropout: float
    num_classes: int

    @classmethod
    def sample(cls, rng: random.Random) -> "MLPArch":
        return cls(
            in_features=rng.choice([64, 256, 784, 1024, 3072]),
            depth=rng.randint(2, 8),
            width=rng.choice([256, 512, 1024, 2048, 4096]),
            act=rng.choice(["relu", "gelu", "silu", "tanh"]),
            norm=rng.choice(["none", "layernorm", "batchnorm"]),
            dropout=rng.choice([0.0, 0.1]),
            num_classes=rng.choice([10, 100, 1000]),
        )


ARCHS = {"transformer": TransformerArch, "cnn": CNNArch, "mlp": MLPArch}


def arch_for(kind: str, seed: int, overrides: dict) -> object:
    cls = ARCHS[kind]
    arch = cls.sample(random.Random(f"{kind}:{seed}"))
    fields = {f.name for f in dataclasses.fields(cls)}
    for key in overrides:
        if key not in fields:
            raise UserError(f"--set {key}: random:{kind} has no field {key!r}; fields: "
                            f"{', '.join(sorted(fields))}" + closest(key, fields))
    arch = dataclasses.replace(arch, **overrides)
    if kind == "transformer" and arch.d_model % arch.heads:
        raise UserError(f"random:transformer: d_model {arch.d_model} is not divisible by heads {arch.heads}")
    return arch


def parse(spec) -> tuple[str, int]:
    kind, _, seed = spec.name.partition(":")
    if kind not in KINDS:
        raise UserError(f"unknown random kind {kind!r} in {spec.spec!r}; allowed: {', '.join(KINDS)}"
                        + closest(kind, KINDS))
    try:
        return kind, int(seed)
    except ValueError:
        raise UserError(f"{spec.spec!r}: the seed must be an integer (e.g. random:{kind}:7)") from None


def build(spec, shape):
    from gnn_ptp.spec import DEFAULT_IMAGE_SIZE, Shape, Workload, classifier_loss, family_of

    kind, seed = parse(spec)
    arch = arch_for(kind, seed, dict(spec.overrides))
    b = shape.batch_size
    if kind == "transformer":
        seq = shape.seq_len or 256
        model = RandomTransformer(arch, max_len=seq)
        ids = torch.randint(0, arch.vocab_size, (b, seq))
        n_out = 10 if arch.classify else arch.vocab_size
        labels = torch.randint(0, n_out, (b,) if arch.classify else (b, seq))
        modality, used = "text", Shape(b, seq, None)
    elif kind == "cnn":
        size = shape.image_size or DEFAULT_IMAGE_SIZE
        model = RandomCNN(arch)
        ids = torch.randn(b, 3, size, size)
        labels = torch.randint(0, arch.num_classes, (b,))
        modality, used = "vision", Shape(b, None, size)
    else:
        model = RandomMLP(arch)
        ids = torch.randn(b, arch.in_features)
        labels = torch.randint(0, arch.num_classes, (b,))
        modality, used = "tabular", Shape(b, None, None)
    return Workload(model, (ids,), {}, {"labels": labels}, classifier_loss, family_of(spec), modality, used)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _norm(kind: str, dim: int) -> nn.Module:
    return nn.LayerNorm(dim) if kind == "layernorm" else RMSNorm(dim)


class Block(nn.Module):
    def __init__(self, a: TransformerArch):
        super().__init__()
        self.a = a
        hidden = int(a.d_model * a.ffn_mult) // 8 * 8
        self.norm1, self.norm2 = _norm(a.norm, a.d_model), _norm(a.norm, a.d_model)
        self.qkv = nn.Linear(a.d_model, 3 * a.d_model)
        self.proj = nn.Linear(a.d_model, a.d_model)
        self.up = nn.Linear(a.d_model, hidden * (2 if a.gated else 1))
        self.down = nn.Linear(hidden, a.d_model)
        self.act = ACTIVATIONS[a.act]()
        self.drop = nn.Dropout(a.dropout)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.a.heads, d // self.a.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=self.a.causal,
                                           dropout_p=self.a.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, s, d)))
        h = self.up(self.norm2(x))
        if self.a.gated:
            gate, h = h.chunk(2, dim=-1)
            h = self.act(gate) * h
        else:
            h = self.act(h)
        return x + self.drop(self.down(h))


class RandomTransformer(nn.Module):
    def __init__(self, a: TransformerArch, max_len: int):
        super().__init__()
        self.a = a
        self.embed = nn.Embedding(a.vocab_size, a.d_model)
        self.pos = nn.Embedding(max_len, a.d_model)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.depth))
        self.norm = _norm(a.norm, a.d_model)
        self.head = nn.Linear(a.d_model, 10 if a.classify else a.vocab_size, bias=False)
        if a.tie_embeddings and not a.classify:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.embed(ids) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        if self.a.classify:
            x = x.mean(dim=1)
        return self.head(x)


class RandomCNN(nn.Module):
    def __init__(self, a: CNNArch):
        super().__init__()
        act = ACTIVATIONS[a.act]
        layers: list[nn.Module] = [nn.Conv2d(3, a.base_width, 3, stride=2, padding=1, bias=False),
                                   self._norm(a, a.base_width), act()]
        width = a.base_width
        for stage in range(a.stages):
            out = width if stage == 0 else int(width * a.growth) // 8 * 8
            for block in range(a.blocks_per_stage):
                stride = 2 if (block == 0 and stage > 0) else 1
                layers.append(ConvBlock(a, width, out, stride))
                width = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(width, a.num_classes)

    @staticmethod
    def _norm(a: CNNArch, ch: int) -> nn.Module:
        if a.norm == "batch":
            return nn.BatchNorm2d(ch)
        if a.norm == "group":
            return nn.GroupNorm(8 if ch % 8 == 0 else 1, ch)
        return nn.Identity()

    def forward(self, x):
        return self.head(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class ConvBlock(nn.Module):
    def __init__(self, a: CNNArch, cin: int, cout: int, stride: int):
        super().__init__()
        pad = a.kernel // 2
        if a.depthwise:
            self.conv = nn.Sequential(
                nn.Conv2d(cin, cin, a.kernel, stride, pad, groups=cin, bias=False),
                nn.Conv2d(cin, cout, 1, bias=False))
        else:
            self.conv = nn.Conv2d(cin, cout, a.kernel, stride, pad, bias=False)
        self.norm = RandomCNN._norm(a, cout)
        self.act = ACTIVATIONS[a.act]()
        self.residual = a.residual and stride == 1 and cin == cout

    def forward(self, x):
        y = self.act(self.norm(self.conv(x)))
        return x + y if self.residual else y


class RandomMLP(nn.Module):
    def __init__(self, a: MLPArch):
        super().__init__()
        layers: list[nn.Module] = []
        width = a.in_features
        for _ in range(a.depth - 1):
            layers.append(nn.Linear(width, a.width))
            if a.norm == "layernorm":
                layers.append(nn.LayerNorm(a.width))
            elif a.norm == "batchnorm":
                layers.append(nn.BatchNorm1d(a.width))
            layers += [ACTIVATIONS[a.act](), nn.Dropout(a.dropout)]
            width = a.width
        layers.append(nn.Linear(width, a.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def param_count(kind: str, seed: int, overrides: dict) -> int:
    """Parameters of ``random:<kind>:<seed>``, counted on the meta device (no memory)."""
    arch = arch_for(kind, seed, overrides)
    with torch.device("meta"):
        model = {"transformer": lambda: RandomTransformer(arch, max_len=1), "cnn": lambda: RandomCNN(arch),
                 "mlp": lambda: RandomMLP(arch)}[kind]()
    return sum(p.numel() for p in model.parameters())
