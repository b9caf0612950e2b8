"""Forced scoring: the training loss without label smoothing, batch-invariant, and ensembles."""

from __future__ import annotations

import torch

from decoding.ensemble import Ensemble
from decoding.scoring import target_log_probs
from tests.transformer.helpers import BOS, EOS, PAD, model_with_eos_bias, ragged_batch
from training.module import token_losses

LENGTHS = [6, 3, 9, 5]
TARGETS = [[5, 6, 7], [8], [9, 10, 11, 12, 13, 14], []]


def teacher_forced(targets: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """tgt_in (BOS + target) and tgt_out (target + EOS), right-padded: [n, longest + 1] each."""
    width = max(len(t) for t in targets) + 1
    tgt_in = torch.tensor([[BOS, *t] + [PAD] * (width - len(t) - 1) for t in targets])
    tgt_out = torch.tensor([[*t, EOS] + [PAD] * (width - len(t) - 1) for t in targets])
    return tgt_in, tgt_out


def test_the_mean_is_minus_the_training_loss_without_label_smoothing() -> None:
    model, src = model_with_eos_bias(), ragged_batch(LENGTHS)
    tgt_in, tgt_out = teacher_forced(TARGETS)
    scores = target_log_probs(model, src, tgt_in, tgt_out)  # (n, T)
    with torch.no_grad():
        losses = token_losses(model, src, tgt_in, tgt_out, PAD, label_smoothing=0.0)  # (n, T)
    torch.testing.assert_close(-scores, losses, rtol=1e-5, atol=1e-5)
    assert (scores[tgt_out == PAD] == 0).all()


def test_scores_do_not_depend_on_the_batch() -> None:
    model, src = model_with_eos_bias(), ragged_batch(LENGTHS)
    tgt_in, tgt_out = teacher_forced(TARGETS)
    together = target_log_probs(model, src, tgt_in, tgt_out).sum(dim=1)
    for i, target in enumerate(TARGETS):
        alone_in, alone_out = teacher_forced([target])
        alone = target_log_probs(model, src[i : i + 1, : LENGTHS[i]], alone_in, alone_out).sum()
        torch.testing.assert_close(alone, together[i], rtol=1e-5, atol=1e-5)


def test_an_ensemble_scores_with_the_weighted_mean() -> None:
    first, second = model_with_eos_bias(), model_with_eos_bias(norm_first=True)
    src = ragged_batch(LENGTHS)
    tgt_in, tgt_out = teacher_forced(TARGETS)
    expected = 0.25 * target_log_probs(first, src, tgt_in, tgt_out) + 0.75 * target_log_probs(
        second, src, tgt_in, tgt_out
    )
    ensemble = Ensemble([first, second], weights=[1, 3])
    torch.testing.assert_close(target_log_probs(ensemble, src, tgt_in, tgt_out), expected)
