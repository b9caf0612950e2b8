"""Suite-wide settings: tiny models run single-threaded and seeded.

One thread is set at import time too, so that module- and session-scoped fixtures (which run
before function-scoped autouse fixtures) do not run with every core and oversubscribe the CPU.
"""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _single_thread_and_seed():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
