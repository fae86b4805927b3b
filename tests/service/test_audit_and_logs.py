"""The audit log's rotation and the JSON log format."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

from scaler.service import audit, logs


def test_audit_lines_are_json_and_rotate_by_size(tmp_path: Path) -> None:
    path = tmp_path / "audit" / "decisions.jsonl"
    log = audit.AuditLog(path, max_bytes=1000, backups=2)
    try:
        for index in range(40):
            log.write({"model": "inference/llama-70b", "index": index, "pad": "x" * 80})
    finally:
        log.close()
    files = sorted(p.name for p in path.parent.iterdir())
    # ~110 bytes a line, 1000 bytes a file: 40 lines need 5 files; only 2 backups are kept.
    assert files == ["decisions.jsonl", "decisions.jsonl.1", "decisions.jsonl.2"]
    for file in path.parent.iterdir():
        assert file.stat().st_size <= 1000
    newest = [json.loads(line) for line in path.read_text().splitlines()]
    assert newest[-1]["index"] == 39
    older = [json.loads(line) for line in (path.parent / "decisions.jsonl.2").read_text()
             .splitlines()]
    assert older[0]["index"] < newest[0]["index"]


def test_json_log_lines_carry_extra_fields_and_exceptions() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.Logger("scaler.test")
    logger.addHandler(handler)
    logger.info("scaled %s", "inference/llama-70b", extra={"desired": 3, "path": Path("/x")})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("patch failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "scaled inference/llama-70b"
    assert first["level"] == "INFO" and first["logger"] == "scaler.test"
    assert first["desired"] == 3 and first["path"] == "/x"
    assert first["time"].endswith("Z")
    assert "RuntimeError: boom" in second["exception"]


def test_configure_replaces_root_handlers() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    try:
        logs.configure(level="WARNING", fmt="json", stream=stream)
        logging.getLogger("scaler.x").warning("careful")
        logging.getLogger("scaler.x").info("hidden")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["careful"]
