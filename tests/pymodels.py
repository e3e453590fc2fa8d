"""Model factories for ``py:tests/pymodels.py:<factory>`` specs used by the tests.

Each follows the contract in ``gnn_ptp.spec.build_py``: called inside ``with torch.device(...)`` with
batch_size, seq_len, image_size and the ``--set`` overrides as keywords.
"""

import torch
from torch import nn
from torch.nn import functional as F


def mlp2(batch_size, seq_len, image_size, in_features=24, hidden=40, out_features=8, bias=True):
    """Linear -> ReLU -> Linear, MSE loss: the 4-tuple contract with positional inputs."""
    model = nn.Sequential(nn.Linear(in_features, hidden, bias=bias), nn.ReLU(),
                          nn.Linear(hidden, out_features, bias=bias))
    inputs = (torch.randn(batch_size, in_features),)
    targets = {"y": torch.randn(batch_size, out_features)}

    def loss_fn(output, y):
        return F.mse_loss(output, y)

    return model, inputs, targets, loss_fn


def mlp2_three(batch_size, seq_len, image_size, in_features=24, hidden=40, out_features=8):
    """The 3-tuple contract (model, inputs, loss_fn) with keyword inputs."""
    model = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))
    inputs = {"input": torch.randn(batch_size, in_features)}
    return model, inputs, lambda output: output.pow(2).mean()


def conv2(batch_size, seq_len, image_size, cin=3, c1=16, c2=24, k=3, stride=1, padding=1, groups=1,
          channels_last=0, stride2=1):
    """Conv2d -> ReLU -> Conv2d, no bias, sum-of-squares loss (``stride`` the first convolution's, ``stride2``
    the second's); with ``channels_last`` the model and its input in torch.channels_last memory format (what
    GPU training under AMP is advised to use)."""
    model = nn.Sequential(nn.Conv2d(cin, c1, k, stride, padding, bias=False), nn.ReLU(),
                          nn.Conv2d(c1, c2, k, stride2, padding, groups=groups, bias=False))
    size = image_size or 16
    x = torch.randn(batch_size, cin, size, size)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, (x,), lambda output: output.float().square().mean()


class _Attention(nn.Module):
    def __init__(self, causal: bool):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.causal = causal

    def forward(self, q, k, v):
        s = self.scale
        return F.scaled_dot_product_attention(q * s, k * s, v * s, is_causal=self.causal)


def attention(batch_size, seq_len, image_size, heads=2, head_dim=32, causal=False):
    """Bare scaled_dot_product_attention on [B, H, S, D] inputs (one scalar parameter, so that the
    backward runs through the attention kernel)."""
    seq = seq_len or 64
    model = _Attention(bool(causal))
    inputs = tuple(torch.randn(batch_size, heads, seq, head_dim) for _ in range(3))
    return model, inputs, lambda output: output.float().sum()


def not_a_tuple(batch_size, seq_len, image_size):
    return nn.Linear(2, 2)


def log_softmax_head(batch_size, seq_len, image_size, in_features=16, classes=8):
    """Linear logits -> log_softmax with no explicit dtype -> nll_loss."""
    model = nn.Linear(in_features, classes)
    inputs = (torch.randn(batch_size, in_features),)
    targets = {"labels": torch.randint(0, classes, (batch_size,))}

    def loss_fn(output, labels):
        return F.nll_loss(F.log_softmax(output, dim=-1), labels)

    return model, inputs, targets, loss_fn


class _MaskedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, q, k, v, mask):
        s = self.scale
        return F.scaled_dot_product_attention(q * s, k * s, v * s, attn_mask=mask)


def masked_attention(batch_size, seq_len, image_size, heads=2, head_dim=32):
    """SDPA with an additive float mask: flash attention cannot take it."""
    seq = seq_len or 32
    inputs = tuple(torch.randn(batch_size, heads, seq, head_dim) for _ in range(3)) + (
        torch.zeros(batch_size, 1, seq, seq),)
    return _MaskedAttention(), inputs, lambda output: output.float().sum()


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:  # a Python branch on tensor data: fake tensors cannot answer it
            return y
        return -y


def data_dependent(batch_size, seq_len, image_size):
    return _DataDependent(), (torch.randn(batch_size, 4),), lambda output: output.sum()


def conv_transpose(batch_size, seq_len, image_size, c1=8, c2=16, k=3, stride=2, groups=1):
    """1x1 Conv2d -> ConvTranspose2d (upsampling), no bias."""
    model = nn.Sequential(nn.Conv2d(3, c1, 1, bias=False),
                          nn.ConvTranspose2d(c1, c2, k, stride, groups=groups, bias=False))
    size = image_size or 8
    return model, (torch.randn(batch_size, 3, size, size),), lambda output: output.float().square().mean()


def conv_bn(batch_size, seq_len, image_size, cin=3, channels=16):
    """Conv2d -> BatchNorm2d -> ReLU, sum-of-squares loss: one batch norm of ``channels`` channels."""
    model = nn.Sequential(nn.Conv2d(cin, channels, 3, 1, 1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
    size = image_size or 16
    inputs = (torch.randn(batch_size, cin, size, size),)
    return model, inputs, lambda output: output.float().square().mean()
