"""Suite-wide settings: tiny models run single-threaded and seeded; ``gpu`` tests need CUDA.

One thread is set at import time too, so that module- and session-scoped fixtures (which run
before function-scoped autouse fixtures) do not run with every core and oversubscribe the CPU.
Tests marked ``gpu`` are skipped, with the reason, where CUDA is absent, so the suite stays green
on CPU machines.
"""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _single_thread_and_seed():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
