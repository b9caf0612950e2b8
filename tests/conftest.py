"""Suite-wide settings: tiny models run single-threaded and seeded."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread_and_seed():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
