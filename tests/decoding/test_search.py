"""Greedy and beam search: agreement with each other, with recomputation, and across batchings."""

import inspect
from dataclasses import asdict

import pytest
import torch

from bench.uncached import Recomputing
from decoding.config import SearchSettings
from decoding.search import beam_search, greedy_search
from decoding.step import length_penalty, max_output_lengths, top_log_probs
from fastpaths import search as fast_search
from fastpaths.optimize import CPU_SEARCH
from tests.transformer.helpers import (
    BOS,
    EOS,
    PAD,
    model_with_eos_bias,
    ragged_batch,
    tiny_model,
)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
def test_beam_size_one_is_greedy(norm_first):
    model = model_with_eos_bias(norm_first)
    src = ragged_batch([4, 9, 6, 2, 7])
    greedy = greedy_search(model, src, BOS, EOS)
    beam = beam_search(model, src, BOS, EOS, beam_size=1, alpha=1.0)
    assert [h[0].tokens for h in beam] == greedy
    assert len({len(g) for g in greedy}) > 1, "outputs should end at different lengths"


def test_cached_search_equals_recomputed_search():
    model = model_with_eos_bias()
    src = ragged_batch([5, 8, 3, 6])
    assert greedy_search(model, src, BOS, EOS) == greedy_search(Recomputing(model), src, BOS, EOS)
    cached = beam_search(model, src, BOS, EOS, beam_size=4, nbest=4)
    recomputed = beam_search(Recomputing(model), src, BOS, EOS, beam_size=4, nbest=4)
    assert [[h.tokens for h in n] for n in cached] == [[h.tokens for h in n] for n in recomputed]
    for a, b in zip(cached, recomputed, strict=True):
        torch.testing.assert_close(torch.tensor([h.score for h in a]), torch.tensor([h.score for h in b]))


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_output_does_not_depend_on_batch_size_or_neighbours(search):
    model = model_with_eos_bias()
    lengths = [6, 3, 9, 5, 7, 4]
    src = ragged_batch(lengths)

    def run(batch):
        if search == "greedy":
            return greedy_search(model, batch, BOS, EOS)
        return [[h.tokens for h in n] for n in beam_search(model, batch, BOS, EOS, beam_size=3, nbest=2)]

    together = run(src)
    alone = [run(src[i : i + 1, :n])[0] for i, n in enumerate(lengths)]
    shuffled_order = [4, 1, 5, 0, 3, 2]
    shuffled = run(src[shuffled_order])
    assert alone == together
    assert [shuffled[shuffled_order.index(i)] for i in range(6)] == together


def test_nbest_is_sorted_by_score_and_scores_are_consistent():
    model = model_with_eos_bias()
    src = ragged_batch([5, 7, 4])
    results = beam_search(model, src, BOS, EOS, beam_size=5, nbest=5, alpha=0.6)
    for hyps in results:
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5, "n-best entries must differ"
        for h in hyps:
            assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens) + 1, 0.6), rel=1e-5)


def test_beam_log_prob_equals_model_log_prob_of_the_output():
    """The log-probability beam search reports is the model's own log P(y | x), EOS included
    for hypotheses that ended by EOS (those cut at the length limit have no EOS)."""
    model = model_with_eos_bias()
    src = ragged_batch([6, 3, 8, 5])
    limits = max_output_lengths(src, PAD, 1.5, 10, 127).tolist()
    results = beam_search(model, src, BOS, EOS, beam_size=3, nbest=3, alpha=0.0)
    ended = 0
    for i, hyps in enumerate(results):
        for h in hyps:
            tgt_out = h.tokens + ([EOS] if len(h.tokens) < limits[i] else [])
            ended += tgt_out[-1:] == [EOS]
            tgt_in = torch.tensor([[BOS] + tgt_out[:-1]])
            with torch.no_grad():
                logits = model(src[i : i + 1], tgt_in)
            logp = logits.log_softmax(-1).gather(2, torch.tensor([tgt_out])[..., None]).sum().item()
            assert h.log_prob == pytest.approx(logp, abs=1e-4)
    assert ended > 0


def test_length_limit_is_a_times_source_plus_b():
    model = tiny_model()
    with torch.no_grad():
        model.output.weight[EOS] -= 100.0  # never ends by itself
    src = ragged_batch([4, 7])
    out = greedy_search(model, src, BOS, EOS, max_len_a=1.0, max_len_b=2)
    assert [len(o) for o in out] == [6, 9]
    beams = beam_search(model, src, BOS, EOS, beam_size=2, max_len_a=1.0, max_len_b=2)
    assert [len(h[0].tokens) for h in beams] == [6, 9]


def test_nbest_larger_than_beam_is_an_error():
    with pytest.raises(ValueError, match="nbest"):
        beam_search(tiny_model(), ragged_batch([3]), BOS, EOS, beam_size=2, nbest=3)


def test_beam_wider_than_half_the_vocabulary():
    """2 * beam_size > vocabulary: every token of every beam is a candidate, nothing breaks."""
    model = tiny_model(tgt_vocab_size=6, max_positions=32)
    hyps = beam_search(model, ragged_batch([4, 3]), BOS, EOS, beam_size=4, nbest=4, max_len_a=0, max_len_b=5)
    assert [len(h) for h in hyps] == [4, 4]


def test_beam_wider_than_the_vocabulary_is_an_error():
    with pytest.raises(ValueError, match="beam_size=7 exceeds the 6-word"):
        beam_search(tiny_model(tgt_vocab_size=6), ragged_batch([3]), BOS, EOS, beam_size=7)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_min_len_holds_eos_back(search):
    model = model_with_eos_bias()
    with torch.no_grad():
        model.output.bias[EOS] = 4.0  # early ends for greedy too
    src = ragged_batch([5, 8, 3, 6])

    def lengths(min_len):
        if search == "greedy":
            return [len(o) for o in greedy_search(model, src, BOS, EOS, min_len=min_len)]
        return [len(h[0].tokens) for h in beam_search(model, src, BOS, EOS, beam_size=3, min_len=min_len)]

    assert min(lengths(0)) < 4, "the EOS bias should end some outputs early"
    assert min(lengths(4)) >= 4
    # The length limit (1.5 * 3 + 10 = 14 for the shortest source) still wins over min_len.
    assert max(lengths(40)) <= max_output_lengths(src, PAD, 1.5, 10, 127).max().item()


@pytest.mark.parametrize("kernel", [top_log_probs, CPU_SEARCH.top_log_probs], ids=["plain", "cpu"])
def test_top_log_probs_are_log_softmax(kernel):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * torch.tensor([0.1, 1.0, 10.0, 50.0, 1.0, 1.0])[:, None]
    logits[4, 7] = float("-inf")  # a banned token
    logits[5] = 0.0  # all tied
    expected_values = logits.log_softmax(-1).topk(8, dim=-1).values
    log_probs, tokens = kernel(logits.clone(), 8)
    torch.testing.assert_close(log_probs, expected_values)
    torch.testing.assert_close(log_probs, logits.log_softmax(-1).gather(1, tokens))


@pytest.mark.parametrize("block", [fast_search.TOPK_BLOCK, 10**6], ids=["blocks", "one-block"])
def test_beam_search_with_the_cpu_kernels_is_the_plain_search(monkeypatch, block):
    """The CPU's search kernels (block top-k, in-place normaliser) find the plain search's outputs
    and scores. A vocabulary of 1,000 (15 blocks of 64 and a partial one) takes row_topk's block
    path; a block as big as the vocabulary makes it plain topk."""
    model = tiny_model(tgt_vocab_size=1000)
    src = ragged_batch([6, 3, 8, 5])
    plain = beam_search(model, src, BOS, EOS, beam_size=3, nbest=3)
    monkeypatch.setattr(fast_search, "TOPK_BLOCK", block)
    blocked = beam_search(model, src, BOS, EOS, beam_size=3, nbest=3, kernels=CPU_SEARCH)
    assert [[h.tokens for h in s] for s in blocked] == [[h.tokens for h in s] for s in plain]
    for b, p in zip(blocked, plain, strict=True):
        assert [h.score for h in b] == pytest.approx([h.score for h in p], abs=1e-5)


@pytest.mark.parametrize("min_len", [0, 3])
def test_logits_made_a_few_rows_at_a_time_change_nothing(monkeypatch, min_len):
    """The search projects its rows' logits in blocks of CPU_LOGIT_VALUES // V rows; blocks of 2 and
    3 rows (odd blocks at the end too, EOS held back in every block) find what one block finds."""
    from decoding import budget

    model = model_with_eos_bias()
    src = ragged_batch([5, 8, 3, 6, 4])
    vocab = model.cfg.tgt_vocab_size

    def run():
        greedy = greedy_search(model, src, BOS, EOS, min_len=min_len)
        return greedy, beam_search(model, src, BOS, EOS, beam_size=3, nbest=3, min_len=min_len)

    whole_greedy, whole_beams = run()
    for rows in (2, 3):
        monkeypatch.setattr(budget, "CPU_LOGIT_VALUES", rows * vocab)
        greedy, beams = run()
        assert greedy == whole_greedy
        assert [[h.tokens for h in n] for n in beams] == [[h.tokens for h in n] for n in whole_beams]
        # F.linear's sums may round differently for fewer rows (packed weights' do not: BENCHMARKS.md).
        for got, expected in zip(beams, whole_beams, strict=True):
            assert [h.score for h in got] == pytest.approx([h.score for h in expected], abs=1e-5)


def test_bfloat16_model_reports_its_outputs_log_prob():
    """Logits stay in bf16 (no fp32 copy of [rows, V]); scores are still fp32 and match the
    fp32 model's log P(y | x) of the same outputs to within bf16 rounding."""
    import copy

    model = model_with_eos_bias()
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    src = ragged_batch([6, 3, 8])
    limits = max_output_lengths(src, PAD, 1.5, 10, 127).tolist()
    for i, hyps in enumerate(beam_search(bf16, src, BOS, EOS, beam_size=3, nbest=3, alpha=0.0)):
        for h in hyps:
            assert isinstance(h.log_prob, float)
            tgt_out = h.tokens + ([EOS] if len(h.tokens) < limits[i] else [])
            with torch.no_grad():
                logits = model(src[i : i + 1], torch.tensor([[BOS] + tgt_out[:-1]]))
            logp = logits.log_softmax(-1).gather(2, torch.tensor([tgt_out])[..., None]).sum().item()
            assert h.log_prob == pytest.approx(logp, abs=0.05 * len(tgt_out))


@pytest.mark.parametrize("search", [greedy_search, beam_search])
def test_search_defaults_are_the_decoding_config(search):
    parameters = inspect.signature(search).parameters
    shared = {name: value for name, value in asdict(SearchSettings()).items() if name in parameters}
    assert shared and {name: parameters[name].default for name in shared} == shared
    if search is beam_search:
        assert set(shared) == set(asdict(SearchSettings()))
