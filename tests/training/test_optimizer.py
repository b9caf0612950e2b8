"""``optimizer.name``: Adam's L2 decay reaches every parameter; AdamW's decoupled decay only the
matrices, also after a resume re-applies the configured settings."""

from __future__ import annotations

import pytest
import torch

from training.module import TranslationModule
from training.pipeline import default_config
from training.start.resume import check_config


def _module(name: str, fused: bool | None = None) -> TranslationModule:
    model = dict(
        src_vocab_size=12, tgt_vocab_size=12, d_model=16, n_heads=2,
        n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0, share_embeddings=True,
    )  # fmt: skip
    settings = {"name": name, "weight_decay": 0.5, "fused": fused}
    return TranslationModule(model, optimizer=settings, lr={"peak": 0.1, "warmup_steps": 0})


@pytest.mark.parametrize("fused", [False, None])  # None: the CPU's fused kernel
def test_adamw_decays_the_matrices_alone_and_apart_from_the_gradient(fused):
    """With zero gradients, AdamW's step is the decay alone: matrices times (1 - lr * wd), biases
    and LayerNorm gains unchanged; Adam's L2 term is a gradient, and moves every parameter."""
    for name in ("adamw", "adam"):
        module = _module(name, fused)
        optimizer = module.configure_optimizers()["optimizer"]
        with torch.no_grad():  # biases start at 0, where no decay can show
            for p in module.model.parameters():
                p.uniform_(0.5, 1.0)
        before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
        for p in module.model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        for n, p in module.model.named_parameters():
            if name == "adam":
                assert not torch.equal(p, before[n]), n
            elif p.dim() >= 2:
                torch.testing.assert_close(p, before[n] * (1 - 0.1 * 0.5), msg=n)
            else:
                assert n.endswith("bias") or ".norm." in n, n
                assert torch.equal(p, before[n]), n


def test_adamw_has_one_group_per_decay_and_every_parameter_once():
    groups = _module("adamw").configure_optimizers()["optimizer"].param_groups
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0]
    params = [p for g in groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == len(list(_module("adamw").model.parameters()))
    assert len(_module("adam").configure_optimizers()["optimizer"].param_groups) == 1  # as before


def test_a_resume_sets_the_configured_decay_on_the_decaying_group_only(monkeypatch):
    module = _module("adamw")
    config = module.configure_optimizers()
    monkeypatch.setattr(module, "optimizers", lambda use_pl_optimizer=False: config["optimizer"])
    monkeypatch.setattr(module, "lr_schedulers", lambda: config["lr_scheduler"]["scheduler"])
    module.hparams.optimizer["weight_decay"] = 0.25  # as resume.allow_changes lets a run change it
    module.on_train_start()
    assert [g["weight_decay"] for g in config["optimizer"].param_groups] == [0.25, 0.0]


def test_an_unknown_optimizer_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="optimizer.name='sgd' is not one of adam, adamw"):
        _module("sgd")


def test_a_checkpoint_from_before_the_setting_resumes_as_adam():
    saved = {"optimizer": {"lr": 1e-3}}  # written before optimizer.name, and before the lr group
    defaults = default_config()  # optimizer.name: adam, what runs did before the setting existed
    now = {"optimizer": {"name": "adam"}, "lr": {"peak": 1e-3}}
    assert check_config(saved, now, [], defaults) == []
    with pytest.raises(Exception, match="optimizer.name: '<absent>' in the checkpoint, 'adamw' now"):
        check_config(saved, {**now, "optimizer": {"name": "adamw"}}, [], defaults)
