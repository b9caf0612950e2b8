"""The pipeline's first step: what the config says, checked before anything is written or prepared.

Keys that moved (:mod:`training.moved_keys`), the attention mechanisms, the validation sets and the
metric that selects checkpoints, BLEU's tokenizer for every language scored (and its extras), the
precision, the ``lr`` and ``budget`` groups: a bad setting is refused naming its key
(:class:`ConfigError`), before the data is prepared, so that no run fails hours in.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue

from common.metrics import check_bleu_tokenizers
from data.settings import DataSettings
from training.budget import BudgetSettings
from training.config import plain
from training.lr import RateSettings
from training.lr.shapes import FLAT
from training.moved_keys import refuse_moved
from training.precision import PrecisionChoice, resolve_precision
from training.run_record import RunRecord
from training.selection import Selection, choose_selection
from transformer.mechanisms import AttentionConfig


class ConfigError(ValueError):
    """A setting of the config that cannot be used; the message names the key."""


@dataclass(frozen=True)
class RunSettings:
    """What the config says, checked before anything is written or prepared.

    Attributes:
        selection: the metric that chooses the best checkpoint and drives early stopping and plateaus.
        precision: the precision chosen, and why.
        lr: the ``lr`` group; budget: the ``budget`` group.
    """

    selection: Selection
    precision: PrecisionChoice
    lr: RateSettings
    budget: BudgetSettings


def check_settings(cfg: DictConfig, record: RunRecord) -> RunSettings:
    """The config checked before anything is written or prepared (module docstring).

    Raises:
        ConfigError: a bad setting, naming its key (a moved key, naming its new name).
    """
    try:
        return _checked_settings(cfg, record)
    except (MissingMandatoryValue, InterpolationToMissingValueError):
        raise  # a value left to the command line (``???``): train.py names it and how to give it
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _checked_settings(cfg: DictConfig, record: RunRecord) -> RunSettings:
    refuse_moved(OmegaConf.to_container(cfg, resolve=False))  # type: ignore[arg-type]
    # A role a mechanism cannot do is refused at once, naming it (transformer/mechanisms.py).
    attention = AttentionConfig.from_dict(plain(cfg.model.get("attention") or DictConfig({})))
    attention.check_dropout(cfg.model.get("attention_dropout", 0.0))
    data = cfg.data
    sets = DataSettings.from_config(plain(data)).corpora.valid_sets  # every data key checked
    names = [s.name for s in sets]
    metric, select_on = str(cfg.checkpoint.get("metric", "bleu")), cfg.checkpoint.get("select_on")
    selection = choose_selection(metric, select_on, names)
    # BLEU's tokenizer, for every language scored, before an update rather than at the first
    # validation: a missing extra (MeCab) or a mistyped name stops the run now, saying what to install.
    languages = sorted({str(data.tgt_lang), *(s.location.tgt_lang for s in sets)})
    check_bleu_tokenizers(languages, cfg.get("bleu_tokenize"), "bleu_tokenize")
    precision = resolve_precision(cfg)
    record.valid_set_names = names
    record.fields.update(selected_by=selection.monitor)
    record.fields.update(precision=precision.precision, precision_reason=precision.reason)
    lr = RateSettings.from_dict(plain(cfg.lr))
    budget = BudgetSettings.from_dict(plain(cfg.budget))
    if budget.fit == "budget" and cfg.trainer.get("max_time") and lr.schedule in FLAT:
        raise ValueError(
            f"lr.schedule={lr.schedule} keeps the rate (or lowers it on plateaus) and budget.fit=budget "
            "decays it to the budget's end: set budget.fit=none, or another schedule"
        )
    return RunSettings(selection, precision, lr, budget)
