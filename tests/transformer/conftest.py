"""Fixtures of the model's property tests."""

import pytest
import torch

from fastpaths.cpu import for_cpu_inference


@pytest.fixture(params=["plain", "cpu-inference"])
def prepare(request):
    """The model as built (autograd on), or as ``Translator`` runs it: ``fastpaths``' CPU swaps
    with autograd off (packed weights, written-out attention). A property test takes
    ``prepare(model)`` and holds for both."""
    if request.param == "plain":
        yield lambda model: model
        return
    with torch.no_grad():
        yield for_cpu_inference
