"""The corpora of a run: where each comes from, its weight, and the tags on its sources.

``data.corpora`` lists the training corpora (conf/data/multi30k.yaml); each entry is a
:class:`TrainingCorpus`. Without the list the run trains on the one corpus of ``data.data_dir`` /
``data.hub_id``. ``data.valid_sets`` lists the validation sets, each a :class:`ValidationSet`, all
validated at every validation (a fine-tuning run watches the new domain and the old one); without
it the run validates on that corpus's ``data.valid_split``.

Tags are words put before every source sentence of a corpus where it is read, and reserved in the
SentencePiece model so that they stay one piece (never ``<``, ``B``, ``T``, ``>``):

* a corpus tag, e.g. ``<BT>`` on back-translated data (Caswell et al., 2019, "Tagged
  Back-Translation"), so the model can tell synthetic sources from real ones;
* with ``data.target_lang_tags``, the target language's tag ``<2fr>`` on every source of every
  split (Johnson et al., 2017, Google's multilingual NMT): one model translates into several
  languages, the tag saying which. ``translate.py --target-lang fr`` puts it on the input.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

# A tag is one word without spaces: SentencePiece keeps a reserved symbol whole.
_TAG = re.compile(r"\S+")
# A validation set's name goes into metric names (val/<name>/bleu) and checkpoint file names.
_SET_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def target_tag(lang: str) -> str:
    """The tag that asks for a translation into ``lang``: ``"<2fr>"``."""
    return f"<2{lang}>"


@dataclass(frozen=True)
class TrainingCorpus:
    """One entry of ``data.corpora``; unset places and languages are the main corpus's.

    Attributes:
        name: names the corpus in the log and ``results.json``.
        data_dir: local ``{split}.{lang}[.gz]`` directory.
        hub_id: hub dataset id (takes precedence over ``data_dir``).
        hub_config: hub dataset configuration.
        split: the split read as training pairs.
        src_lang: source language (file suffix or column).
        tgt_lang: target language.
        weight: how many times its pairs count per epoch (> 0): 2 upsamples, 0.5 draws half.
        tag: a word put before each of its source sentences (e.g. ``"<BT>"``), or None.
    """

    name: str
    data_dir: str | None = None
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "train"
    src_lang: str = ""
    tgt_lang: str = ""
    weight: float = 1.0
    tag: str | None = None

    def source_prefix(self, target_lang_tags: bool) -> str:
        """What goes before each source sentence: its tags and a space, or ``""``."""
        tags = [target_tag(self.tgt_lang)] if target_lang_tags else []
        tags += [self.tag] if self.tag else []
        return "".join(t + " " for t in tags)


def _checked_entry(entry: object, where: str, known: set[str], what: str) -> Mapping:
    """``entry`` checked to be a mapping of ``known`` keys with a name and a one-word tag.

    Raises:
        ValueError: naming ``<where>.<key>``.
    """
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a mapping of {sorted(known)}, not {entry!r}")
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not a setting of a {what}; they are {sorted(known)}")
    if not entry.get("name"):
        raise ValueError(f"{where}.name is missing: each {what} needs a name for the log")
    tag = entry.get("tag")
    if tag is not None and not _TAG.fullmatch(str(tag)):
        raise ValueError(f"{where}.tag must be one word without spaces, not {tag!r}")
    return entry


def _place(
    entry: Mapping, data_dir: str | None, hub_id: str | None, hub_config: str | None
) -> tuple[str | None, str | None, str | None]:
    """The entry's ``data_dir``, ``hub_id``, ``hub_config``: all its own where it gives a place,
    else all the main corpus's (a hub_config alone does not move it to another corpus)."""
    if entry.get("data_dir") is not None or entry.get("hub_id") is not None:
        return entry.get("data_dir"), entry.get("hub_id"), entry.get("hub_config")
    return data_dir, hub_id, hub_config


def parse_corpora(
    entries: Sequence[Mapping] | None,
    src_lang: str,
    tgt_lang: str,
    data_dir: str | None,
    hub_id: str | None,
    hub_config: str | None,
    train_split: str,
) -> list[TrainingCorpus]:
    """``data.corpora`` as :class:`TrainingCorpus` entries, the main corpus's settings filling gaps.

    Args:
        entries: the list from the config; None or empty: the main corpus alone, at weight 1.
        src_lang: ``data.src_lang``.
        tgt_lang: ``data.tgt_lang``.
        data_dir: ``data.data_dir``.
        hub_id: ``data.hub_id``.
        hub_config: ``data.hub_config``.
        train_split: ``data.train_split``.

    Raises:
        ValueError: an unknown key, a missing or repeated name, a weight that is not a positive
            number, or a tag with spaces; the message names ``data.corpora[i].<key>``.
    """
    if not entries:
        return [TrainingCorpus("train", data_dir, hub_id, hub_config, train_split, src_lang, tgt_lang)]
    known = {f.name for f in fields(TrainingCorpus)}
    corpora: list[TrainingCorpus] = []
    for i, entry in enumerate(entries):
        where = f"data.corpora[{i}]"
        entry = _checked_entry(entry, where, known, "corpus")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"{where}.weight must be a positive number, not {weight!r}")
        tag = entry.get("tag")
        corpus = TrainingCorpus(
            str(entry["name"]),
            *_place(entry, data_dir, hub_id, hub_config),
            split=str(entry.get("split") or train_split),
            src_lang=str(entry.get("src_lang") or src_lang),
            tgt_lang=str(entry.get("tgt_lang") or tgt_lang),
            weight=float(weight),
            tag=None if tag is None else str(tag),
        )
        if any(c.name == corpus.name for c in corpora):
            raise ValueError(f"{where}.name {corpus.name!r} is used twice: names tell the corpora apart")
        corpora.append(corpus)
    return corpora


@dataclass(frozen=True)
class ValidationSet:
    """One entry of ``data.valid_sets``; unset places and languages are the main corpus's.

    Attributes:
        name: names its metrics (``val/<name>/bleu``) and the log lines; letters, digits, ``_.-``.
        data_dir: local ``{split}.{lang}[.gz]`` directory.
        hub_id: hub dataset id (takes precedence over ``data_dir``).
        hub_config: hub dataset configuration.
        split: the split read as its pairs.
        src_lang: source language (file suffix or column).
        tgt_lang: target language.
        tag: a word put before each of its source sentences (e.g. the tag of the training corpus
            of its domain), or None.
    """

    name: str
    data_dir: str | None = None
    hub_id: str | None = None
    hub_config: str | None = None
    split: str = "val"
    src_lang: str = ""
    tgt_lang: str = ""
    tag: str | None = None

    def source_prefix(self, target_lang_tags: bool) -> str:
        """What goes before each source sentence: its tags and a space, or ``""``."""
        tags = [target_tag(self.tgt_lang)] if target_lang_tags else []
        tags += [self.tag] if self.tag else []
        return "".join(t + " " for t in tags)

    @property
    def split_key(self) -> str:
        """Its key among the data module's splits: ``"validation/<name>"``."""
        return valid_split_key(self.name)


def valid_split_key(name: str | None) -> str:
    """The data module's split key of validation set ``name``; ``"validation"`` for None (the main
    corpus's ``data.valid_split``, validated where ``data.valid_sets`` is empty)."""
    return "validation" if name is None else f"validation/{name}"


def parse_valid_sets(
    entries: Sequence[Mapping] | None,
    src_lang: str,
    tgt_lang: str,
    data_dir: str | None,
    hub_id: str | None,
    hub_config: str | None,
    valid_split: str,
) -> list[ValidationSet]:
    """``data.valid_sets`` as :class:`ValidationSet` entries, the main corpus's settings filling gaps.

    Args:
        entries: the list from the config; None or empty: ``[]``, the run validates on the main
            corpus's ``valid_split`` alone (metrics ``val/bleu``, ...).
        src_lang: ``data.src_lang``.
        tgt_lang: ``data.tgt_lang``.
        data_dir: ``data.data_dir``.
        hub_id: ``data.hub_id``.
        hub_config: ``data.hub_config``.
        valid_split: ``data.valid_split``.

    Raises:
        ValueError: an unknown key, a missing or repeated name, a name that cannot go into metric
            and file names, or a tag with spaces; the message names ``data.valid_sets[i].<key>``.
    """
    known = {f.name for f in fields(ValidationSet)}
    sets: list[ValidationSet] = []
    for i, entry in enumerate(entries or []):
        where = f"data.valid_sets[{i}]"
        entry = _checked_entry(entry, where, known, "validation set")
        name = str(entry["name"])
        if not _SET_NAME.fullmatch(name):
            raise ValueError(
                f"{where}.name {name!r} must be letters, digits, '_', '.' or '-': it names the metrics "
                "(val/<name>/bleu) and the best checkpoint's file"
            )
        if any(s.name == name for s in sets):
            raise ValueError(f"{where}.name {name!r} is used twice: names tell the validation sets apart")
        tag = entry.get("tag")
        sets.append(
            ValidationSet(
                name,
                *_place(entry, data_dir, hub_id, hub_config),
                split=str(entry.get("split") or valid_split),
                src_lang=str(entry.get("src_lang") or src_lang),
                tgt_lang=str(entry.get("tgt_lang") or tgt_lang),
                tag=None if tag is None else str(tag),
            )
        )
    return sets


def reserved_tags(
    corpora: Sequence[TrainingCorpus | ValidationSet], target_lang_tags: bool, tgt_lang: str
) -> list[str]:
    """Every tag the sources can carry (SentencePiece's user-defined symbols), in a fixed order.

    Args:
        corpora: the training corpora, then the validation sets (whose tags a given model must
            keep whole too).
        target_lang_tags: ``data.target_lang_tags``.
        tgt_lang: the main corpus's target language.
    """
    tags = [c.tag for c in corpora if c.tag]
    if target_lang_tags:
        tags += [target_tag(lang) for lang in [*(c.tgt_lang for c in corpora), tgt_lang]]
    return list(dict.fromkeys(tags))
