"""The composed config (conf/train.yaml and its groups): its resolvers, its defaults, its plain form."""

from __future__ import annotations

import os
import secrets

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from data.corpus import PROJECT_ROOT


def register_resolvers() -> None:
    """``${project_root:}`` and ``${unique_id:}`` (one value per process) for the configs."""
    if not OmegaConf.has_resolver("project_root"):
        OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT))
    if not OmegaConf.has_resolver("unique_id"):
        token = f"{os.getpid()}{secrets.token_hex(2)}"
        OmegaConf.register_new_resolver("unique_id", lambda: token)


register_resolvers()


def default_config(overrides: list[str] | None = None) -> dict:
    """``conf/train.yaml`` composed with ``overrides`` (none: every setting's default), interpolations
    such as the output directory left unresolved: they need a running job."""
    if GlobalHydra.instance().is_initialized():  # inside train.py's @hydra.main
        return OmegaConf.to_container(compose(config_name="train", overrides=overrides or []))  # type: ignore[return-value]
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="train", overrides=overrides or []))  # type: ignore[return-value]


def model_group(name: str) -> dict:
    """The ``model`` settings of ``conf/model/<name>.yaml``, as the config composes them."""
    return default_config([f"model={name}"])["model"]


def plain(cfg: DictConfig) -> dict:
    """``cfg`` as plain dicts and lists with interpolations resolved, as the module's hyperparameters."""
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
