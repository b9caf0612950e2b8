"""Train a Transformer translator: ``python train.py [group=option ...] [key=value ...]``.

Examples:
    python train.py                                   # Multi30k de->en, small model, CPU
    python train.py experiment=multi30k_de_en         # the tuned CPU recipe (README)
    python train.py data.src_lang=en data.tgt_lang=de model=tiny trainer.max_epochs=1
    python train.py ... ckpt_path=last                # resume the newest run of this name
    python train.py ... init_from=runs/<name>/<run>/checkpoints/averaged.ckpt  # fine-tune those weights
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig
from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue

from fastpaths.allocators import configure_allocators

configure_allocators()  # before torch is imported and allocates (fastpaths/allocators.py)

from common.checkpoint_file import CheckpointError  # noqa: E402
from data.corpus import CorpusError, CorpusNotFoundError  # noqa: E402
from data.tokenizer import SpmModelError  # noqa: E402
from training.moved_keys import MovedKeyError, refuse_moved_overrides  # noqa: E402
from training.pipeline import ConfigError, train  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    logging.getLogger("data").setLevel(logging.INFO)
    logging.getLogger("training").setLevel(logging.INFO)
    try:
        train(cfg)
    except (CorpusNotFoundError, CorpusError, SpmModelError, CheckpointError, ConfigError) as err:
        # A missing or damaged corpus, an unusable data.spm_model, init_from or ckpt_path, a bad
        # setting: the user's to fix, and the message says how (naming the file, line or key):
        # print it alone. Hydra catches Exception only, so SystemExit passes it by without a traceback.
        sys.exit(f"train.py: error: {err}")
    except (MissingMandatoryValue, InterpolationToMissingValueError) as err:
        # A setting an experiment leaves to the command line (``???``), e.g. bt_dir.
        missing = str(err).splitlines()[0].rsplit(": ", 1)[-1]
        sys.exit(f"train.py: error: {missing} must be given (used by {err.full_key}): add {missing}=VALUE")


if __name__ == "__main__":
    try:  # before Hydra, which would refuse a key that moved without saying where it went
        refuse_moved_overrides(sys.argv[1:])
    except MovedKeyError as err:
        sys.exit(f"train.py: error: {err}")
    main()
