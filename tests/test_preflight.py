"""The device preflight (tests/device_preflight.py) in an environment with the lent GPU image's versions.

CI builds that environment (.venv-device: torch 2.11.0, transformers 5.17.0, torchvision 0.26.0, timm,
torch-geometric 2.8.0, no optuna, no wandb) and points GNN_PTP_DEVICE_PYTHON at its interpreter."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

DEVICE_PYTHON = os.environ.get("GNN_PTP_DEVICE_PYTHON")
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not DEVICE_PYTHON, reason="GNN_PTP_DEVICE_PYTHON (an interpreter with the device image's "
                                              "versions) is not set; .ci/run sets it")
def test_device_image_preflight(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([DEVICE_PYTHON, str(ROOT / "tests" / "device_preflight.py"), str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "torch 2.11.0" in done.stdout and "'optuna': False" in done.stdout
    assert done.stdout.count("ok: ") == 3
