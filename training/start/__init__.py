"""Where a run starts, made once: fresh, resumed, initialised from a checkpoint's weights, or tested.

* :mod:`training.start.point`: :class:`StartPoint` and :func:`start_point`, the one place that
  reads the checkpoint a run starts from and decides what it gives.
* :mod:`training.start.resume`: which checkpoint ``ckpt_path`` means, and the config checked
  against the checkpoint's.
* :mod:`training.start.init`: ``init_from``'s checks (the model config, its regularisation).
* :mod:`training.start.carried`: what ``finetune.reset`` carries on from the checkpoint.
* :mod:`training.start.vocabulary`: the checkpoint's SentencePiece model(s), pinned for the run.
"""

from training.start.init import FineTuneError
from training.start.point import FRESH, INITIALISED, RESUMED, TESTED, StartPoint, start_point

__all__ = ["FRESH", "INITIALISED", "RESUMED", "TESTED", "FineTuneError", "StartPoint", "start_point"]
