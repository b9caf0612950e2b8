"""What a search may not output: a minimum length, repeated n-grams, and a forced target prefix.

Each is applied to a step's next-token log-probabilities, [rows, V], before the search chooses:

* **minimum length**: EOS is impossible while fewer than ``min_len`` tokens are out (applied to
  the logits, so the other tokens' probabilities are renormalised, :func:`ensemble.combined_log_probs`);
* **no repeated n-gram** (``no_repeat_ngram = n``): a token that would complete an n-gram the row
  has already output gets -inf (fairseq's ``--no-repeat-ngram-size``, OpenNMT's
  ``block_ngram_repeat``); the others are not renormalised;
* **prefix**: while ``t < len(prefix)`` a row's only possible token is ``prefix[t]``, at its own
  log-probability, so that scores stay those of the model (fairseq's ``--prefix-size``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Constraints:
    """The constraints of one batch of sentences.

    Attributes:
        eos_id: the EOS id.
        min_len: EOS is forbidden before this many output tokens.
        no_repeat_ngram: no n-gram of this size occurs twice in an output (0: no constraint).
        prefixes: [n, P] long, per sentence of the batch its forced first target tokens, padded
            with -1; None: none forced.
    """

    eos_id: int
    min_len: int = 0
    no_repeat_ngram: int = 0
    prefixes: Tensor | None = None

    def __post_init__(self) -> None:
        if self.min_len < 0:
            raise ValueError(f"min_len must be at least 0, not {self.min_len}")
        if self.no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be at least 0, not {self.no_repeat_ngram}")

    @property
    def need_log_probs(self) -> bool:
        """Whether a step needs full log-probabilities (the constraints act after the softmax)."""
        return self.no_repeat_ngram > 0 or self.prefixes is not None

    def prefix_lengths(self) -> Tensor | None:
        """[n] the number of forced tokens of each sentence, or None."""
        return None if self.prefixes is None else (self.prefixes >= 0).sum(dim=1)

    def apply(self, log_probs: Tensor, t: int, history: Tensor | None, sentences: Tensor | None) -> Tensor:
        """Constrains a block of rows in place.

        Args:
            log_probs: [rows, V] fp32 next-token log-probabilities at output position ``t``.
            t: tokens output so far.
            history: [rows, t] the rows' output tokens so far (BOS excluded); needed with
                ``no_repeat_ngram``.
            sentences: [rows] the batch index of each row's sentence (into ``prefixes``);
                needed with ``prefixes``.

        Returns:
            ``log_probs``.
        """
        forced = None
        if self.prefixes is not None and sentences is not None and t < self.prefixes.size(1):
            tokens = self.prefixes[sentences, t]  # (rows,), -1 where the prefix has ended
            rows = (tokens >= 0).nonzero().squeeze(1)
            if rows.numel():
                forced = rows, tokens[rows], log_probs[rows, tokens[rows]].clone()
        if self.no_repeat_ngram and history is not None:
            ban_repeated_ngrams(log_probs, history, self.no_repeat_ngram)
        if forced is not None:
            rows, tokens, values = forced
            log_probs[rows] = float("-inf")
            log_probs[rows, tokens] = values
        return log_probs


def ban_repeated_ngrams(log_probs: Tensor, history: Tensor, n: int) -> None:
    """Sets to -inf every token that would complete an n-gram already in the row's history.

    log_probs: [rows, V], changed in place; history: [rows, t] output tokens so far.
    """
    t = history.size(1)
    if t < n:  # no whole n-gram yet
        return
    ngrams = history.unfold(1, n, 1)  # (rows, t - n + 1, n): every n-gram so far
    tail = history[:, t - (n - 1) :]  # (rows, n - 1): what the next token would extend
    match = (ngrams[:, :, :-1] == tail[:, None, :]).all(dim=-1)  # (rows, t - n + 1)
    rows, where = match.nonzero(as_tuple=True)
    log_probs[rows, ngrams[rows, where, -1]] = float("-inf")


def prefix_tensor(prefixes: Sequence[Sequence[int]] | None, device: torch.device) -> Tensor | None:
    """Prefixes as [n, longest] long padded with -1, or None when none forces a token."""
    if prefixes is None or not any(prefixes):
        return None
    width = max(len(p) for p in prefixes)
    rows = [list(p) + [-1] * (width - len(p)) for p in prefixes]
    return torch.tensor(rows, dtype=torch.long, device=device)
