"""Third-party noise a run's log should not carry, silenced where it arises (imported by the pipeline)."""

from __future__ import annotations

import logging
import warnings

# torch's pytree deprecated its LeafSpec class for treespec_leaf() (a FutureWarning at each
# construction, worded "`isinstance(treespec, LeafSpec)` is deprecated"; torch 2.13 warns). Lightning
# (2.6.6, its newest release, and its main branch) still constructs one in
# lightning/pytorch/utilities/_pytree.py:_tree_flatten, which CombinedLoader calls for every
# dataloader the Trainer runs, so every run printed it (Lightning issue #21326). The call is
# Lightning's, not ours, and harmless until torch removes the class: that one warning from that
# one module is ignored, here rather than in pytest's settings, so that train.py's users do not see it.
warnings.filterwarnings(
    "ignore",
    message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    category=FutureWarning,
    module=r"lightning\.pytorch\.utilities\._pytree",
)


class _NoLitLoggerTip(logging.Filter):
    """Drops the advertisement for Lightning's hosted logger that every Trainer prints at start
    (lightning/pytorch/trainer/connectors/logger_connector: "Tip: ... try installing litlogger")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


# The logger Lightning's rank_zero_info writes to (lightning_utilities' rank_zero.log).
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoLitLoggerTip())
