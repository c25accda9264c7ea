"""How ``kafka-cleaner run`` and ``clean`` log: ``--log-level`` and ``--log-format text|json``.

A traceback is for whoever debugs the cleaner, not for the person reading why a partition
failed: below ``--log-level debug`` a record's traceback is left out (its message, which
names the file, position and cause, stays). JSON lines carry the same fields as text,
one object a line, for a log pipeline.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _TextFormatter(logging.Formatter):
    def __init__(self, tracebacks: bool) -> None:
        super().__init__(_TEXT)
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if self.tracebacks:
            return super().format(record)
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text = saved


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    ``thread`` and, at debug level, ``exception``."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        if self.tracebacks and record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure(level: str, fmt: str = "text") -> None:
    """Log to stderr at ``level`` (one of ``LEVELS``) in ``fmt`` (one of ``FORMATS``)."""
    numeric = getattr(logging, level.upper())
    tracebacks = numeric <= logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(tracebacks) if fmt == "json" else _TextFormatter(tracebacks))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
