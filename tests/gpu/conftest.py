"""The GPU tests' shared setting: fp32 means fp32. (Each module here is marked ``gpu``.)

Where a test compares fp32 results across kernels or devices, TF32 matmuls (which another test
or ``float32_matmul_precision: high`` in the same process may have switched on) would make the
differences orders of magnitude larger; each test starts from PyTorch's default, "highest".
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _true_fp32_matmuls():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)
