"""Every rank's random-number states in a checkpoint, so that a resumed run draws as one never stopped."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

logger = logging.getLogger(__name__)


def rng_states(device: torch.device) -> dict[str, Tensor]:
    """This process's RNG states: the CPU's, and the CUDA (or MPS) device's it trains on."""
    states = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    if device.type == "mps":
        states["mps"] = torch.mps.get_rng_state()
    return states


def set_rng_states(rng: dict[str, Any], rank: int, world_size: int, device: torch.device) -> None:
    """Restores rank ``rank``'s states from a checkpoint's ``rng`` (:func:`rng_states` of every rank).

    On another number of processes than were saved, rank ``r`` takes the states of saved rank
    ``r % saved`` and rank 0 warns once that the run can no longer be bit-exact (the batches
    each rank sees change too). Checkpoints written before per-rank states held rank 0's alone
    (``torch``, and ``cuda`` for every visible GPU); they are read as one saved rank.
    """
    if "per_rank" in rng:
        saved = rng["per_rank"]
    else:
        cuda = rng.get("cuda")
        old = {"torch": rng["torch"]}
        if cuda is not None and device.type == "cuda" and (device.index or 0) < len(cuda):
            old["cuda"] = cuda[device.index or 0]
        saved = [old]
    if len(saved) != world_size and rank == 0:
        logger.warning(
            "resuming on %d process(es) from a checkpoint of %d: the batches each rank trains on and its"
            " dropout draws change, so the run can no longer be bit-exact with one never stopped",
            world_size,
            len(saved),
        )
    states = saved[rank % len(saved)]
    torch.set_rng_state(states["torch"])
    if "cuda" in states and device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"], device)
    if "mps" in states and device.type == "mps":
        torch.mps.set_rng_state(states["mps"])
