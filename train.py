"""Train a Transformer translator: ``python train.py [group=option ...] [key=value ...]``.

Examples:
    python train.py                                   # Multi30k de->en, small model, CPU
    python train.py experiment=multi30k_de_en         # the tuned CPU recipe (README)
    python train.py data.src_lang=en data.tgt_lang=de model=tiny trainer.max_epochs=1
    python train.py ... ckpt_path=last                # resume the newest run of this name
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from training.pipeline import train


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    logging.getLogger("data").setLevel(logging.INFO)
    logging.getLogger("training").setLevel(logging.INFO)
    train(cfg)


if __name__ == "__main__":
    main()
