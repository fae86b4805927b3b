"""Structured logging: one JSON object per line, with `extra=` fields kept as keys."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any, TextIO

# Attributes every LogRecord has; anything else came from `extra=` and is logged as a key.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message", ...extra, "exception"} per record."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        task = getattr(record, "taskName", None)
        if task:
            document["task"] = task
        # default=str: an odd extra (a Path, a datetime) must never lose the log line.
        return json.dumps(document, default=str, separators=(",", ":"))


def configure(*, level: str = "INFO", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Send the root logger to `stream` (stderr) as JSON or text, replacing its handlers."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
