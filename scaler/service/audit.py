"""The audit log: one JSON line per decision with its reasons, rotated by size."""

from __future__ import annotations

import json
import logging
import logging.handlers
from pathlib import Path
from typing import Any


class AuditLog:
    """Append-only JSONL, `path` rotated to path.1 ... path.N past `max_bytes`.

    The standard library's RotatingFileHandler does the rotation (one rename chain, the
    same as logrotate's); a private logger that does not propagate keeps audit lines out
    of the service log.
    """

    def __init__(self, path: Path, *, max_bytes: int, backups: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._logger = logging.Logger(f"scaler.audit.{path}", level=logging.INFO)
        self._logger.propagate = False
        self._logger.addHandler(self._handler)

    def write(self, document: dict[str, Any]) -> None:
        self._logger.info(json.dumps(document, separators=(",", ":"), default=str))

    def close(self) -> None:
        self._logger.removeHandler(self._handler)
        self._handler.close()
