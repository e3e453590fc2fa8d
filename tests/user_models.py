"""Factories for ``py:`` specs as a newcomer writes them (tests/test_bad_input.py, tests/test_readme.py):
the README's contract with plain tensors, and the usual mistakes in a user's own code.

Each mistake sits on a line the tests look for (``# LINE: <name>``), so that an error message naming
``user_models.py:<line>`` can be checked against the real line.
"""

import torch
from torch import nn


def classifier(batch_size, seq_len, image_size, features=32, classes=10):
    """As the README describes it: a tensor input, a tensor target, a loss module."""
    model = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, classes))
    inputs = torch.randn(batch_size, features)
    targets = torch.randint(0, classes, (batch_size,))
    return model, inputs, targets, nn.CrossEntropyLoss()


def raises(batch_size, seq_len, image_size):
    raise ValueError("no such layer size")  # LINE: raises


def shape_error(batch_size, seq_len, image_size):
    """Inputs of 64 features into a layer of 32: fails inside the model's forward."""
    model = nn.Sequential(nn.Linear(32, 8))
    inputs = torch.randn(batch_size, 64)
    return model, inputs, torch.randn(batch_size, 8), nn.MSELoss()


class _Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x):
        return self.lin(x).view(-1, 7)  # LINE: forward


def broken_forward(batch_size, seq_len, image_size):
    return _Broken(), torch.randn(batch_size, 16), torch.randn(batch_size, 4), nn.MSELoss()


def returns_two(batch_size, seq_len, image_size):
    return nn.Linear(4, 4), torch.randn(batch_size, 4)


def not_a_module(batch_size, seq_len, image_size):
    return "model", torch.randn(batch_size, 4), torch.randn(batch_size, 4), nn.MSELoss()


def bad_inputs(batch_size, seq_len, image_size):
    return nn.Linear(4, 4), 42, torch.randn(batch_size, 4), nn.MSELoss()


def no_loss(batch_size, seq_len, image_size):
    return nn.Linear(4, 4), torch.randn(batch_size, 4), torch.randn(batch_size, 4), None


def no_kwargs(batch_size):
    return nn.Linear(4, 4), torch.randn(batch_size, 4), nn.MSELoss()


def line_of(name: str) -> int:
    """The line of this file marked ``# LINE: <name>``."""
    from pathlib import Path

    for number, line in enumerate(Path(__file__).read_text().splitlines(), 1):
        if line.rstrip().endswith(f"# LINE: {name}"):
            return number
    raise KeyError(name)
