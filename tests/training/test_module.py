"""The Lightning module on its own: it memorises a toy batch, and its schedule has the paper's shape.

Also: a compiled training step gives the same losses as an eager one, and fused Adam is clipped
under bf16 autocast.
"""

from dataclasses import asdict

import lightning as L
import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader

from data.batching import collate_batch
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SubwordTokenizer
from decoding.search import greedy_search
from tests.toy_text import toy_pairs, train_word_spm
from training.lr.shapes import inverse_sqrt_factor
from training.module import EvalDecoding, TranslationModule


def _toy_batch() -> tuple[dict, list[list[int]], int]:
    """A batch of 10 toy pairs, the target ids and the vocabulary size."""
    pairs = toy_pairs(10, seed=3)
    tok = SubwordTokenizer(train_word_spm([s for pair in pairs for s in pair]))
    src_ids = tok.encode([s for s, _ in pairs])
    tgt_ids = tok.encode([t for _, t in pairs])
    examples = zip(src_ids, tgt_ids, strict=True)
    batch = collate_batch(
        [{"id": i, "src_ids": s + [EOS_ID], "tgt_ids": t} for i, (s, t) in enumerate(examples)]
    )
    return batch, tgt_ids, tok.vocab_size


def _tiny(vocab: int) -> dict:
    """A one-layer model without dropout (a compiled step draws other dropout masks than eager)."""
    return dict(
        src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=32, n_heads=4,
        n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.0, share_embeddings=True,
    )  # fmt: skip


def test_module_overfits_a_toy_batch():
    batch, tgt_ids, vocab = _toy_batch()
    module = TranslationModule(_tiny(vocab), lr={"peak": 3e-3, "warmup_steps": 10}, label_smoothing=0.0)
    trainer = L.Trainer(
        max_steps=200, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader([batch] * 200, batch_size=None))
    module.eval()
    assert trainer.callback_metrics["train/loss"] < 0.05
    assert greedy_search(module.model, batch["src"], BOS_ID, EOS_ID) == tgt_ids


# inductor builds C++ kernels on the CPU: ~20 s with a cold cache on the 2-core machine (cached on disk).
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_training_steps_give_the_eager_losses(backend):
    batch, _, vocab = _toy_batch()
    torch._dynamo.reset()
    counters.clear()
    losses = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        module = TranslationModule(_tiny(vocab), compile={"backend": backend} if compiled else False).train()
        adam = torch.optim.Adam(module.model.parameters(), lr=3e-3)
        losses[compiled] = []
        for _ in range(4):
            loss_sum, n_tokens = module.loss(batch, label_smoothing=0.1)
            loss = loss_sum.sum() / n_tokens.sum()
            loss.backward()
            adam.step()
            adam.zero_grad()
            losses[compiled].append(loss.item())
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo did compile (no silent fallback)
    torch._dynamo.reset()
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-5, atol=1e-5)
    assert losses[True][-1] < losses[True][0]
    # Evaluation runs the model eagerly: the compiled function is used for training only.
    counters.clear()
    module.eval()
    with torch.no_grad():
        module.loss(batch, label_smoothing=0.0)
    assert not counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_compiled_loss_gives_the_eager_block_losses_and_gradients(monkeypatch, device: str):
    """The losses ``fastpaths.optimize`` chooses for a device's training, compiled and eager (its
    choice is the same on any machine, so a GPU's runs here on the CPU): compiled for a GPU, the
    plain two-call loss in the model's graph (no graph break: the block loss, which failed to
    compile on an H200 over several bf16 blocks, is not traced); for the CPU the eager block loss
    after the graph. Either way the step equals the eager block loss's over several blocks under
    bf16 autocast."""
    import fastpaths.loss as block_loss
    from fastpaths.optimize import optimize
    from training.loss import cross_entropy
    from training.module import token_losses

    batch, _, vocab = _toy_batch()
    monkeypatch.setattr(block_loss, "default_block_rows", lambda device, vocab: 8)  # several blocks
    paths = optimize(torch.nn.Module(), device, "train")
    assert paths.loss is block_loss.projected_cross_entropy  # eager: the block loss on both
    torch._dynamo.reset()
    counters.clear()
    results = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = TranslationModule(_tiny(vocab)).model.train()
        fn = torch.compile(token_losses, backend="aot_eager") if compiled else token_losses
        loss_function = (paths.compiled_loss if compiled else paths.loss) or cross_entropy
        with torch.autocast("cpu", dtype=torch.bfloat16):
            # with the host's target positions, as training passes them
            losses = fn(
                model,
                batch["src"],
                batch["tgt_in"],
                batch["tgt_out"],
                PAD_ID,
                0.1,
                loss_function,
                positions=batch["tgt_positions"],
            )
        losses.sum().backward()
        results[compiled] = [losses.detach()] + [p.grad for p in model.parameters()]
    assert counters["stats"]["unique_graphs"] == 1  # the model (and the two-call loss): one graph
    breaks = sum(counters["graph_break"].values())
    # No break on a GPU; on the CPU the block loss is skipped (called after the graph).
    assert (breaks == 0) == (device == "cuda"), dict(counters["graph_break"])
    torch._dynamo.reset()
    assert int((batch["tgt_out"] != PAD_ID).sum()) > 16  # more than two blocks of 8 rows
    for a, b in zip(results[True], results[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


def test_compiled_training_compiles_twice_across_sentence_lengths():
    """torch.compile's static graph, then one dynamic graph for every later shape, also where the
    lengths cross the 16 keys at which the CPU's attention softmax changes path for decoding (a
    guard on that length compiled the model again on each side of it)."""
    from training.module import token_losses

    torch.manual_seed(0)
    model = TranslationModule(_tiny(50)).model.train()
    fn = torch.compile(token_losses, backend="aot_eager")
    torch._dynamo.reset()
    counters.clear()
    for batch, src_len, tgt_len in [(8, 5, 6), (7, 9, 4), (4, 18, 20), (5, 12, 17), (3, 25, 9), (6, 14, 15)]:
        src = torch.randint(4, 50, (batch, src_len))
        tgt = torch.randint(4, 50, (batch, tgt_len))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fn(model, src, tgt, tgt, PAD_ID, 0.1).sum().backward()
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    torch._dynamo.reset()


def _first_update_gradients(module: TranslationModule, batches: list[dict], accumulate: int) -> list:
    """The gradients of the module's first update over ``batches`` (lr 0: the weights stay)."""
    grads = []

    class Record(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            grads.extend(p.grad.clone() for p in pl_module.model.parameters())

    trainer = L.Trainer(
        max_steps=1, accelerator="cpu", accumulate_grad_batches=accumulate, gradient_clip_val=None,
        callbacks=[Record()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    return grads


def test_an_update_normalised_by_its_tokens_has_the_gradient_of_its_batches_as_one():
    """loss_normalization=update: two accumulated batches of 3 and 7 pairs (different token
    counts) give the gradient of one batch holding all 10; the per-batch mean ("batch") does not."""
    pairs = toy_pairs(10, seed=3)
    tok = SubwordTokenizer(train_word_spm([s for pair in pairs for s in pair]))
    src_ids, tgt_ids = (tok.encode([pair[side] for pair in pairs]) for side in (0, 1))
    examples = [
        {"id": i, "src_ids": s + [EOS_ID], "tgt_ids": t}
        for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True))
    ]
    parts = [collate_batch(examples[:3]), collate_batch(examples[3:])]
    whole = collate_batch(examples)

    def grads(normalization: str, batches: list[dict], accumulate: int) -> list:
        torch.manual_seed(0)
        module = TranslationModule(
            _tiny(tok.vocab_size), lr={"peak": 0.0, "warmup_steps": 1}, loss_normalization=normalization
        )
        return _first_update_gradients(module, batches, accumulate)

    one = grads("update", [whole], 1)
    assert one and all(g.abs().sum() > 0 for g in one[:3])
    torch.testing.assert_close(grads("batch", [whole], 1), one)  # one batch: the two agree
    for a, b in zip(grads("update", parts, 2), one, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    averaged = grads("batch", parts, 2)
    assert not all(torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(averaged, one, strict=True))


def test_under_ddp_the_update_is_normalised_by_every_ranks_tokens():
    """Lightning divided by accumulate_grad_batches and DDP by the world size: both are multiplied
    back, and the all-reduced (summed) count of every rank's tokens divides."""
    from types import SimpleNamespace

    module = TranslationModule(_tiny(12), loss_normalization="update")
    reduced = []

    def reduce(tensor, reduce_op):
        reduced.append(reduce_op)
        return tensor + 30  # the other rank's 30 tokens

    module._trainer = SimpleNamespace(
        strategy=SimpleNamespace(reduce=reduce), accumulate_grad_batches=3, world_size=2
    )
    for p in module.model.parameters():
        p.grad = torch.ones_like(p)
    module._update_tokens = 10
    module._divide_gradients_by_update_tokens()
    assert reduced == ["sum"] and module._update_tokens == 0
    for p in module.model.parameters():
        torch.testing.assert_close(p.grad, torch.full_like(p, 3 * 2 / 40))
    module._trainer = None


def test_fused_adam_is_clipped_under_bf16_autocast():
    """Lightning refuses to clip a fused optimizer under mixed precision (fp16's scaler would have
    to unscale first); bf16 has no scaler, and the module clips the gradients itself."""
    batch, _, vocab = _toy_batch()
    module = TranslationModule(_tiny(vocab), optimizer={"fused": True, "warmup_steps": 10})
    norms = []

    class RecordNorms(L.Callback):
        def on_train_start(self, trainer, pl_module):
            def record(optimizer, args, kwargs):  # after the step: the clipped gradients are still there
                grads = [
                    p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
                ]
                norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

            trainer.optimizers[0].register_step_post_hook(record)

    trainer = L.Trainer(
        max_steps=3, accelerator="cpu", precision="bf16-mixed", gradient_clip_val=1e-3,
        callbacks=[RecordNorms()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=DataLoader([batch] * 3, batch_size=None))
    assert trainer.optimizers[0].defaults["fused"] is True
    assert norms == pytest.approx([1e-3] * 3, rel=1e-3)


def test_fused_adam_is_automatic_except_under_fp16_scaling(monkeypatch):
    module = TranslationModule(_tiny(12))  # optimizer.fused null: auto; the parameters are on the CPU
    assert module.configure_optimizers()["optimizer"].defaults["fused"] is True
    # fp16 (CUDA only in Lightning) scales the gradients, which must be unscaled before clipping.
    monkeypatch.setattr(module, "_grad_scaler", lambda: torch.amp.GradScaler("cpu"))
    assert module.configure_optimizers()["optimizer"].defaults["fused"] is False


def test_fused_adam_takes_the_same_steps_as_the_per_tensor_one():
    """The CPU's automatic choice changes how Adam is computed, not what it computes.

    With eps 1e-6 rather than the paper's 1e-9: the attention's key bias has no true gradient
    (softmax ignores a constant added to every score), only rounding noise of ~1e-10, which Adam
    at eps 1e-9 divides by its own square root into full-size steps of either sign: there the two
    kernels' rounding decides the step (seen on an emulated AVX2 CPU).
    """
    batch, _, vocab = _toy_batch()
    params = {}
    for fused in (False, True):
        torch.manual_seed(0)
        settings = {"fused": fused, "warmup_steps": 10, "eps": 1e-6}
        module = TranslationModule(_tiny(vocab), optimizer=settings)
        optimizer = module.configure_optimizers()["optimizer"]
        assert optimizer.defaults["fused"] is fused
        for _ in range(3):
            optimizer.zero_grad()
            loss_sum, n_tokens = module.loss(batch, label_smoothing=0.1)
            (loss_sum.sum() / n_tokens.sum()).backward()
            optimizer.step()
        params[fused] = [p.detach().clone() for p in module.model.parameters()]
    for a, b in zip(params[False], params[True], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_hyperparameters_must_be_plain_dicts():
    from omegaconf import OmegaConf

    with pytest.raises(TypeError, match="plain dict"):
        TranslationModule(OmegaConf.create({"src_vocab_size": 8, "tgt_vocab_size": 8}))


def test_decoding_hyperparameters_load_as_checkpoints_store_them(tmp_path):
    """The ``decoding`` dict keeps its checkpoint form, so checkpoints written before and after load."""
    # As a checkpoint written before decoding.min_len and decoding.no_repeat_ngram stores it.
    stored = {"beam_size": 4, "alpha": 1.0, "max_len_a": 1.0, "max_len_b": 50, "valid_beam_size": 2}
    module = TranslationModule(_tiny(12), decoding=stored)
    assert module.hparams.decoding == asdict(EvalDecoding(**stored)) and type(module.hparams.decoding) is dict
    path = tmp_path / "module.ckpt"
    checkpoint = {
        "state_dict": module.state_dict(),
        "hyper_parameters": {**module.hparams, "decoding": stored},
    }
    torch.save({**checkpoint, "pytorch-lightning_version": L.__version__}, path)
    loaded = TranslationModule.load_from_checkpoint(path, weights_only=True)
    assert loaded.decoding == EvalDecoding(**stored)
    # Settings left out take their defaults; an unknown one is an error that names it.
    assert TranslationModule(_tiny(12), decoding={"beam_size": 3}).decoding == EvalDecoding(beam_size=3)
    with pytest.raises(ValueError, match="unknown setting.*beam_width"):
        TranslationModule(_tiny(12), decoding={"beam_width": 3})
    with pytest.raises(ValueError, match="valid_beam_size must be at least 1"):
        TranslationModule(_tiny(12), decoding={"valid_beam_size": 0})


def test_inverse_sqrt_schedule_rises_linearly_then_decays_as_inverse_sqrt():
    assert inverse_sqrt_factor(50, 100) == pytest.approx(0.5)
    assert inverse_sqrt_factor(100, 100) == pytest.approx(1.0)
    assert inverse_sqrt_factor(400, 100) == pytest.approx(0.5)
    peak = max(range(1, 1000), key=lambda s: inverse_sqrt_factor(s, 100))
    assert peak == 100


def test_a_checkpoint_restores_the_nonfinite_streak_and_the_rng():
    saved = TranslationModule(_tiny(12), max_nonfinite_in_a_row=5)
    saved.nonfinite.in_a_row, saved.nonfinite.skipped = 3, 7
    checkpoint: dict = {}
    torch.manual_seed(11)
    saved.on_save_checkpoint(checkpoint)
    expected = torch.rand(4)
    assert len(checkpoint["rng"]["per_rank"]) == 1  # one process: its own states alone
    loaded = TranslationModule(_tiny(12), max_nonfinite_in_a_row=5)
    torch.manual_seed(99)
    loaded.on_load_checkpoint(checkpoint)
    assert (loaded.nonfinite.in_a_row, loaded.nonfinite.skipped) == (3, 7)  # the streak counts on
    assert torch.equal(torch.rand(4), expected)


def test_a_checkpoint_of_two_ranks_gives_each_rank_its_own_rng_and_warns_on_another_count(caplog):
    from training.rng import set_rng_states

    states = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        states.append({"torch": torch.get_rng_state()})
    expected = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        expected.append(torch.rand(3))
    cpu = torch.device("cpu")
    with caplog.at_level("WARNING"):
        for rank in (0, 1):
            set_rng_states({"per_rank": states}, rank, 2, cpu)
            assert torch.equal(torch.rand(3), expected[rank])
        assert "no longer be bit-exact" not in caplog.text
        set_rng_states({"per_rank": states}, 0, 1, cpu)  # resumed on one process from two
        assert "resuming on 1 process(es) from a checkpoint of 2" in caplog.text
        assert "no longer be bit-exact" in caplog.text
        set_rng_states({"torch": states[1]["torch"]}, 0, 1, cpu)  # a checkpoint from before per-rank states
        assert torch.equal(torch.rand(3), expected[1])


@pytest.mark.parametrize("beam_size", [1, 3])
def test_evaluation_searches_as_translate_py_whatever_the_batches_and_the_budget(beam_size):
    """Validation and test keep each batch's sources (one read by the host a batch) and search
    them at the stage's end through ``decoding.Searcher``, batched under the decoding budget as
    translate.py batches them: the outputs are each sentence's own, in the examples' order,
    whatever the evaluation batches and the budget."""
    from decoding import DecodingConfig
    from tests.host_syncs import HostSyncs

    batch, _, vocab = _toy_batch()
    torch.manual_seed(0)
    module = TranslationModule(_tiny(vocab), decoding={"max_len_b": 6, "valid_beam_size": beam_size}).eval()
    halves = [{k: v[:4] if k != "tgt_positions" else None for k, v in batch.items()}, None]
    halves[1] = {k: v[4:] if k != "tgt_positions" else None for k, v in batch.items()}
    found = {}
    for budget in (None, 3 * beam_size * batch["src"].size(1)):  # the device's, and 3 sentences
        module.decoding_budget = budget
        with torch.no_grad():
            for half in halves:
                with HostSyncs() as syncs:
                    module._eval_step(half, "valid")
                assert [op for op, _ in syncs.calls].count("aten._local_scalar_dense.default") == 0
                assert len(syncs.calls) <= 1, syncs.calls  # the one read of the batch's sources
            found[budget] = module._search("valid")
    whole, pieces = found.values()
    assert [r[0] for r in whole] == list(range(10)) and pieces == whole
    src = batch["src"]
    sources = [row[: int(n) - 1].tolist() for row, n in zip(src, batch["src_lengths"], strict=True)]
    config = DecodingConfig(max_len_b=6, beam_size=beam_size, greedy=beam_size == 1)
    alone = [module.searcher.search_ids([s], config)[0][0].tokens for s in sources]
    assert [r[3] for r in whole] == alone
    nll, n_tokens = module.loss(batch, 0.0)
    assert [r[1] for r in whole] == pytest.approx(nll.tolist(), rel=1e-5)
    assert [r[2] for r in whole] == n_tokens.tolist()
