"""The corpora of a run: where each comes from, its weight, and the tags on its sources.

``data.corpora`` lists the training corpora (conf/data/multi30k.yaml); each entry is a
:class:`TrainingCorpus`. Without the list the run trains on the one corpus of ``data.data_dir`` /
``data.hub_id``. ``data.valid_sets`` lists the validation sets, each a :class:`ValidationSet`, all
validated at every validation (a fine-tuning run watches the new domain and the old one); without
it the run validates on that corpus's ``data.valid_split``. Each entry's place, split and languages
are its own where it gives them, else the main corpus's: one :class:`data.corpus.CorpusLocation`.
:class:`RunCorpora` holds them all, with the main corpus.

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
from dataclasses import dataclass

from data.corpus import CorpusLocation

# A tag is one word without spaces: SentencePiece keeps a reserved symbol whole.
_TAG = re.compile(r"\S+")
# A validation set's name goes into metric names (val/<name>/bleu) and checkpoint file names.
_SET_NAME = re.compile(r"[A-Za-z0-9_.-]+")
# The settings of a data.corpora entry and of a data.valid_sets entry.
_CORPUS_KEYS = frozenset(
    {"name", "data_dir", "hub_id", "hub_config", "split", "src_lang", "tgt_lang", "weight", "tag"}
)
_SET_KEYS = _CORPUS_KEYS - {"weight"}


def target_tag(lang: str) -> str:
    """The tag that asks for a translation into ``lang``: ``"<2fr>"``."""
    return f"<2{lang}>"


def _source_prefix(tgt_lang: str, tag: str | None, target_lang_tags: bool) -> str:
    """What goes before each source sentence: the tags and a space, or ``""``."""
    tags = [target_tag(tgt_lang)] if target_lang_tags else []
    tags += [tag] if tag else []
    return "".join(t + " " for t in tags)


@dataclass(frozen=True)
class TrainingCorpus:
    """One entry of ``data.corpora``; unset places and languages are the main corpus's.

    Attributes:
        name: names the corpus in the log and ``results.json``.
        location: where it is; its ``train_split`` is the split read as training pairs.
        weight: how many times its pairs count per epoch (> 0): 2 upsamples, 0.5 draws half.
        tag: a word put before each of its source sentences (e.g. ``"<BT>"``), or None.
    """

    name: str
    location: CorpusLocation
    weight: float = 1.0
    tag: str | None = None

    def source_prefix(self, target_lang_tags: bool) -> str:
        """What goes before each source sentence: its tags and a space, or ``""``."""
        return _source_prefix(self.location.tgt_lang, self.tag, target_lang_tags)


@dataclass(frozen=True)
class ValidationSet:
    """One entry of ``data.valid_sets``; unset places and languages are the main corpus's.

    Attributes:
        name: names its metrics (``val/<name>/bleu``) and the log lines; letters, digits, ``_.-``.
        location: where it is; its ``valid_split`` is the split read as its pairs.
        tag: a word put before each of its source sentences (e.g. the tag of the training corpus
            of its domain), or None.
    """

    name: str
    location: CorpusLocation
    tag: str | None = None

    def source_prefix(self, target_lang_tags: bool) -> str:
        """What goes before each source sentence: its tags and a space, or ``""``."""
        return _source_prefix(self.location.tgt_lang, self.tag, target_lang_tags)

    @property
    def split_key(self) -> str:
        """Its key among the data module's splits: ``"validation/<name>"``."""
        return valid_split_key(self.name)


def valid_split_key(name: str | None) -> str:
    """The data module's split key of validation set ``name``; ``"validation"`` for None (the main
    corpus's ``data.valid_split``, validated where ``data.valid_sets`` is empty)."""
    return "validation" if name is None else f"validation/{name}"


def _checked_entry(entry: object, where: str, known: frozenset[str], what: str) -> Mapping:
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


def _entry_location(entry: Mapping, main: CorpusLocation, split_key: str) -> CorpusLocation:
    """An entry's location: its own ``data_dir``, ``hub_id``, ``hub_config`` where it gives a place,
    else all the main corpus's (a hub_config alone does not move it to another corpus); its
    languages and its split (``split_key``: ``"train_split"`` or ``"valid_split"``), else the main
    corpus's; the main corpus's fallback. The split it does not read keeps its default name (as
    its cache key always had)."""
    if entry.get("data_dir") is not None or entry.get("hub_id") is not None:
        place = (entry.get("data_dir"), entry.get("hub_id"), entry.get("hub_config"))
    else:
        place = (main.data_dir, main.hub_id, main.hub_config)
    return CorpusLocation(
        str(entry.get("src_lang") or main.src_lang),
        str(entry.get("tgt_lang") or main.tgt_lang),
        *place,
        fallback_hub_id=main.fallback_hub_id,
        **{split_key: str(entry.get("split") or getattr(main, split_key))},
    )


def parse_corpora(entries: Sequence[Mapping] | None, main: CorpusLocation) -> list[TrainingCorpus]:
    """``data.corpora`` as :class:`TrainingCorpus` entries, the main corpus's settings filling gaps.

    Args:
        entries: the list from the config; None or empty: the main corpus alone, named
            ``"train"``, at weight 1.
        main: the main corpus (``data.src_lang`` ... ``data.fallback_hub_id``).

    Raises:
        ValueError: an unknown key, a missing or repeated name, a weight that is not a positive
            number, or a tag with spaces; the message names ``data.corpora[i].<key>``.
    """
    if not entries:
        return [TrainingCorpus("train", main)]
    corpora: list[TrainingCorpus] = []
    for i, entry in enumerate(entries):
        where = f"data.corpora[{i}]"
        entry = _checked_entry(entry, where, _CORPUS_KEYS, "corpus")
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"{where}.weight must be a positive number, not {weight!r}")
        tag = entry.get("tag")
        corpus = TrainingCorpus(
            str(entry["name"]),
            _entry_location(entry, main, "train_split"),
            weight=float(weight),
            tag=None if tag is None else str(tag),
        )
        if any(c.name == corpus.name for c in corpora):
            raise ValueError(f"{where}.name {corpus.name!r} is used twice: names tell the corpora apart")
        corpora.append(corpus)
    return corpora


def parse_valid_sets(entries: Sequence[Mapping] | None, main: CorpusLocation) -> list[ValidationSet]:
    """``data.valid_sets`` as :class:`ValidationSet` entries, the main corpus's settings filling gaps.

    Args:
        entries: the list from the config; None or empty: ``[]``, the run validates on the main
            corpus's ``valid_split`` alone (metrics ``val/bleu``, ...).
        main: the main corpus (``data.src_lang`` ... ``data.fallback_hub_id``).

    Raises:
        ValueError: an unknown key, a missing or repeated name, a name that cannot go into metric
            and file names, or a tag with spaces; the message names ``data.valid_sets[i].<key>``.
    """
    sets: list[ValidationSet] = []
    for i, entry in enumerate(entries or []):
        where = f"data.valid_sets[{i}]"
        entry = _checked_entry(entry, where, _SET_KEYS, "validation set")
        name = str(entry["name"])
        if not _SET_NAME.fullmatch(name):
            raise ValueError(
                f"{where}.name {name!r} must be letters, digits, '_', '.' or '-': it names the metrics "
                "(val/<name>/bleu) and the best checkpoint's file"
            )
        if any(s.name == name for s in sets):
            raise ValueError(f"{where}.name {name!r} is used twice: names tell the validation sets apart")
        tag = entry.get("tag")
        location = _entry_location(entry, main, "valid_split")
        sets.append(ValidationSet(name, location, tag=None if tag is None else str(tag)))
    return sets


@dataclass(frozen=True)
class RunCorpora:
    """Every corpus a run reads: the main corpus, the training corpora, the validation sets, the tags.

    The main corpus gives what no list replaces: its training split unless ``listed``, its
    validation split unless ``valid_sets`` (it need not exist then), and always the test split.

    Attributes:
        main: the main corpus (``data.src_lang`` ... ``data.fallback_hub_id``).
        training: the training corpora (``data.corpora``), mixed by weight; without the list, the
            main corpus alone, named ``"train"``.
        listed: ``data.corpora`` lists the training corpora.
        temperature: ``data.corpora_temperature``: weights from the corpora's sizes, or None.
        valid_sets: ``data.valid_sets``, in the order of the validation loaders.
        target_lang_tags: ``data.target_lang_tags``: the target language's tag on every source.
    """

    main: CorpusLocation
    training: tuple[TrainingCorpus, ...]
    listed: bool
    temperature: float | None
    valid_sets: tuple[ValidationSet, ...]
    target_lang_tags: bool

    @classmethod
    def parse(
        cls,
        main: CorpusLocation,
        corpora: Sequence[Mapping] | None,
        corpora_temperature: float | None,
        valid_sets: Sequence[Mapping] | None,
        target_lang_tags: bool,
    ) -> RunCorpora:
        """From the ``data:`` keys of the same names.

        Raises:
            ValueError: a bad entry (:func:`parse_corpora`, :func:`parse_valid_sets`), or a
                temperature below 1 or beside a weight; naming the key.
        """
        training = parse_corpora(corpora, main)
        if corpora_temperature is not None:
            if not corpora_temperature >= 1:
                raise ValueError(
                    f"data.corpora_temperature must be null or at least 1, not {corpora_temperature}"
                )
            weighted = [i for i, c in enumerate(training) if c.weight != 1]
            if weighted:
                raise ValueError(
                    f"data.corpora[{weighted[0]}].weight is set and so is data.corpora_temperature, "
                    "which chooses the weights: give one of them"
                )
        sets = parse_valid_sets(valid_sets, main)
        return cls(
            main, tuple(training), bool(corpora), corpora_temperature, tuple(sets), bool(target_lang_tags)
        )

    @property
    def main_prefix(self) -> str:
        """What goes before each source sentence of the main corpus: its target tag, or ``""``."""
        return target_tag(self.main.tgt_lang) + " " if self.target_lang_tags else ""

    @property
    def reserved(self) -> list[str]:
        """Every tag the sources can carry (SentencePiece's user-defined symbols), in a fixed order:
        the corpora's and the validation sets' tags (a given model must keep them whole too),
        then the target languages' tags."""
        entries = [*self.training, *self.valid_sets]
        tags = [c.tag for c in entries if c.tag]
        if self.target_lang_tags:
            tags += [
                target_tag(lang) for lang in [*(c.location.tgt_lang for c in entries), self.main.tgt_lang]
            ]
        return list(dict.fromkeys(tags))

    @property
    def target_tags(self) -> dict[str, str]:
        """With ``target_lang_tags``: each target language's source tag (``{"fr": "<2fr>"}``), else {}."""
        if not self.target_lang_tags:
            return {}
        langs = [c.location.tgt_lang for c in [*self.training, *self.valid_sets]] + [self.main.tgt_lang]
        return {lang: target_tag(lang) for lang in sorted(set(langs))}

    @property
    def validation_splits(self) -> list[str]:
        """The split keys validated, in loader order: ``["validation/<name>", ...]`` for
        ``valid_sets``, else ``["validation"]``."""
        return [v.split_key for v in self.valid_sets] or [valid_split_key(None)]

    def split_target_lang(self, split: str) -> str:
        """The target language of a split's references: a validation set's own, else the main corpus's."""
        for v in self.valid_sets:
            if v.split_key == split and v.location.tgt_lang:
                return v.location.tgt_lang
        return self.main.tgt_lang
