"""Where a run starts: one value, made once, before the data is prepared.

A run starts **fresh** (weights initialised, a vocabulary trained on the corpus), **resumed**
(``ckpt_path``, or a requeued SLURM job's own newest checkpoint: the run continues exactly),
**initialised** (``init_from``: a new run from a checkpoint's weights, ``finetune.reset`` choosing
what else carries on) or **tested** (``train=false`` with ``ckpt_path``: its weights only tested).
:func:`start_point` reads the one checkpoint file involved once (memory-mapped, by the project's
reader) and checks everything about it before anything is written or prepared: the config against
the checkpoint's, the model, the vocabulary, what carries on. The :class:`StartPoint` it returns is
what every later step reads: the data keys of the vocabulary, the model config, the weights, the
learning rate and callbacks' carried state, and the checkpoint Lightning restores (the same dict:
:class:`training.checkpoint_io.AtomicCheckpointIO` hands it over rather than reading the file again).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.checkpoint_file import WEIGHTS, CheckpointError, read_checkpoint
from training.lr import LearningRate, RateSettings
from training.moved_keys import migrate_config
from training.selection import Selection
from training.start.carried import RESETTABLE, Carried, carried_state, parse_reset
from training.start.init import FineTuneError, check_init, init_model
from training.start.resume import check_config, find_resumed, run_dir_of
from training.start.vocabulary import pinned_vocabulary

logger = logging.getLogger(__name__)

FRESH, RESUMED, INITIALISED, TESTED = "fresh", "resumed", "initialised", "tested"


@dataclass(frozen=True)
class StartPoint:
    """Where a run starts (module docstring).

    Attributes:
        kind: :data:`FRESH`, :data:`RESUMED`, :data:`INITIALISED` or :data:`TESTED`.
        path: the checkpoint file (None when fresh).
        checkpoint: what it holds, read once, memory-mapped (None when fresh).
        run_dir: the run a resumed checkpoint belongs to (its ``checkpoints/``'s parent), or None.
        vocabulary: the ``data`` keys naming the checkpoint's SentencePiece model(s), written into
            this run's ``tokenizer/``; empty when fresh (the corpus trains one).
        model: the model config the run builds from (the checkpoint's, with this run's
            regularisation), for an initialised run; None: the run's ``model`` config.
        carried: what an initialised run carries on (``finetune.reset``); None otherwise.
        recipe: the recipe a resumed run's checkpoint was fitted to its budget with
            (``recipe.chosen``: dotted key -> value), which it keeps; empty otherwise.
        reset: the parts an initialised run takes fresh.
        said: what the log says about the start, in order: (logging level, line).
    """

    kind: str
    path: Path | None = None
    checkpoint: dict[str, Any] | None = field(default=None, repr=False)
    run_dir: Path | None = None
    vocabulary: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    carried: Carried | None = None
    reset: frozenset[str] = frozenset(RESETTABLE)
    said: tuple[tuple[int, str], ...] = ()
    recipe: dict[str, Any] = field(default_factory=dict)

    @property
    def global_step(self) -> int:
        """The updates the checkpoint's weights were trained (0 when fresh)."""
        return int((self.checkpoint or {}).get("global_step", 0))

    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint Lightning restores the whole training state from (resumed only)."""
        return str(self.path) if self.kind == RESUMED else None

    @property
    def weights(self) -> dict[str, Any] | None:
        """The weights an initialised run loads into its module (``state_dict``), else None."""
        return self.checkpoint["state_dict"] if self.kind == INITIALISED and self.checkpoint else None

    def learning_rate(
        self, settings: RateSettings, mode: str, fitted_to_budget: bool = False
    ) -> LearningRate:
        """The run's learning rate: from ``settings`` (``lr``), the plateau judged by ``mode``, the
        decay's end fitted to a time budget where ``fitted_to_budget``, and the checkpoint's schedule
        continued where ``finetune.reset`` carries it on."""
        rate = LearningRate(settings, mode, fitted_to_budget)
        if self.carried is not None and self.carried.rate is not None:
            rate.carry(*self.carried.rate)
        return rate


def start_point(
    config: dict[str, Any], output_dir: Path, selection: Selection, defaults: Callable[[], dict]
) -> StartPoint:
    """The run's start point, from its resolved config (plain containers).

    Args:
        config: the run's config, resolved (``ckpt_path``, ``init_from``, ``train``, ``resume``,
            ``finetune``, ``model``, ``data``, ``lr``, ``budget``, ``early_stopping`` are read).
        output_dir: this run's directory (the vocabulary's files go into its ``tokenizer/``).
        selection: the metric that selects checkpoints (carried scores must be on it).
        defaults: the project's default config, asked for when resuming (a checkpoint's config
            may lack newer keys).

    Raises:
        FineTuneError: ``init_from`` with ``ckpt_path``, or a checkpoint or config it cannot go with.
        CheckpointError: a damaged checkpoint, another vocabulary, or a changed setting on resume.
        FileNotFoundError: no such ``ckpt_path``, or nothing for ``ckpt_path=last``.
    """
    init_from, ckpt_path, train = (
        config.get("init_from"),
        config.get("ckpt_path"),
        bool(config.get("train", True)),
    )
    if init_from and ckpt_path:
        raise FineTuneError(
            f"init_from={init_from} and ckpt_path={ckpt_path} are both given: init_from starts a new run "
            "from a checkpoint's weights (fresh optimizer, schedule and data order), ckpt_path resumes "
            "a run exactly; give one of them"
        )
    resume = config.get("resume") or {}
    found = find_resumed(
        ckpt_path if train or ckpt_path else None,
        config["paths"]["runs_dir"],
        config["name"],
        output_dir,
        take_newest_loadable=bool(resume.get("take_newest_loadable", False)),
        training=train,
    )
    if found is not None:
        return _resumed(*found, config, output_dir, defaults, train)
    if init_from:
        return _initialised(Path(init_from), config, output_dir, selection)
    return StartPoint(FRESH)


def _resumed(
    path: Path,
    checkpoint: dict[str, Any],
    config: dict[str, Any],
    output_dir: Path,
    defaults: Callable[[], dict],
    train: bool,
) -> StartPoint:
    """A run resumed from (or, not training, testing) ``checkpoint``: its config checked, its
    vocabulary pinned."""
    run_dir = run_dir_of(path)
    said = []
    if config.get("init_from"):  # a requeued fine-tuning job: its own checkpoint wins
        said.append((logging.INFO, f"init_from: not loaded; the requeued run resumes from {path}"))
    saved = migrate_config(checkpoint.get("run_config"))
    recipe = kept_recipe(saved, config)
    if recipe:  # chosen for its budget when it started: kept, as if given
        config = with_keys(config, {**recipe, "recipe.chosen": recipe})
        said.append((logging.INFO, f"resume: the recipe fitted to the budget kept: {recipe}"))
    if train:
        allowed = [str(k) for k in (config.get("resume") or {}).get("allow_changes") or []]
        changes = check_config(saved, config, allowed, defaults() if saved is not None else None)
        said += [(logging.WARNING, f"resume: {change}") for change in changes]
    vocabulary, words = pinned_vocabulary(checkpoint, path, config["data"], output_dir, run_dir, "ckpt_path")
    if words:
        said.append((logging.INFO, f"resume: {words}" if train else f"tested with {words}"))
    kind = RESUMED if train else TESTED
    return StartPoint(kind, path, checkpoint, run_dir, vocabulary, said=tuple(said), recipe=recipe)


def kept_recipe(saved: dict[str, Any] | None, config: dict[str, Any]) -> dict[str, Any]:
    """The recipe a checkpoint's run chose for its budget (its ``recipe.chosen``), where this run
    fits one too (``recipe.fit=budget``); empty otherwise."""
    chosen = ((saved or {}).get("recipe") or {}).get("chosen")
    fitted = (config.get("recipe") or {}).get("fit") == "budget"
    return dict(chosen) if chosen and fitted else {}


def with_keys(config: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with the dotted keys of ``values`` set."""
    out = copy.deepcopy(config)
    for key, value in values.items():
        *groups, last = key.split(".")
        node = out
        for group in groups:
            node = node.setdefault(group, {})
        node[last] = value
    return out


def _initialised(path: Path, config: dict[str, Any], output_dir: Path, selection: Selection) -> StartPoint:
    """A new run from ``path``'s weights, with what ``finetune.reset`` carries on."""
    if not path.is_file():
        raise FineTuneError(f"init_from={path}: no such checkpoint file")
    try:
        checkpoint = read_checkpoint(path, WEIGHTS)  # an averaged checkpoint holds weights only
        said = [
            (logging.WARNING, line) for line in check_init(checkpoint, path, config["model"], config["data"])
        ]
        vocabulary, _ = pinned_vocabulary(checkpoint, path, config["data"], output_dir, None, "init_from")
    except FineTuneError:
        raise
    except CheckpointError as err:
        raise FineTuneError(f"init_from: {err}") from None
    nmt = checkpoint["nmt"]
    data = config["data"]
    if nmt.get("src_lang") and (nmt.get("src_lang"), nmt.get("tgt_lang")) != (
        data["src_lang"],
        data["tgt_lang"],
    ):
        said.append(
            (
                logging.WARNING,
                f"init_from: {path} was trained on {nmt['src_lang']}->{nmt.get('tgt_lang')}, this run trains "
                f"{data['src_lang']}->{data['tgt_lang']}",
            )
        )
    reset = parse_reset(list((config.get("finetune") or {}).get("reset", list(RESETTABLE))))
    budget = config.get("budget") or {}
    budget_fit = bool((config.get("trainer") or {}).get("max_time")) and budget.get("fit") == "budget"
    early = (config.get("early_stopping") or {}).get("patience") is not None
    lr = RateSettings.from_dict(config.get("lr") or {})
    carried = carried_state(checkpoint, path, reset, selection.monitor, selection.mode, early, budget_fit, lr)
    return StartPoint(
        INITIALISED,
        path,
        checkpoint,
        None,
        vocabulary,
        model=init_model(checkpoint, config["model"]),
        carried=carried,
        reset=reset,
        said=tuple(said),
    )
