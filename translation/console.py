"""``translate.py`` on stderr: log records as ``LEVEL: message`` and a progress bar that they do
not tear; stdout is the translations' alone."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm


class TqdmHandler(logging.Handler):
    """Writes records to stderr through ``tqdm.write``, so that they do not tear the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


@contextmanager
def stderr_logging(quiet: bool) -> Iterator[None]:
    """Log records to stderr as 'LEVEL: message' while translating; removed afterwards."""
    root = logging.getLogger()
    handler = TqdmHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.setLevel(logging.WARNING if quiet else logging.INFO)
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(min(old_level, handler.level) if old_level else handler.level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def progress_bar(unit: str, desc: str, quiet: bool) -> tqdm:
    """A progress bar on stderr, shown on a terminal unless ``quiet``; its total grows as parts come."""
    return tqdm(unit=unit, file=sys.stderr, disable=quiet or not sys.stderr.isatty(), desc=desc)
