"""Logging: structured JSON in containers, plain text on a terminal, one format for all
records, uvicorn's access log included."""

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

# Record attributes that carry run context; every record about a run has them.
RUN_FIELDS = ("job", "run_id", "scheduled_for", "runner")
# What service.tracing.TraceIds adds while tracing is on.
TRACE_FIELDS = ("trace_id", "span_id")
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any run context;
    `process` (api or scheduler) when the pod's work is split between processes."""

    def __init__(self, process: str | None = None) -> None:
        super().__init__()
        self._process = {} if process is None else {"process": process}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            **self._process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry |= {f: getattr(record, f) for f in RUN_FIELDS + TRACE_FIELDS if hasattr(record, f)}
        if record.name == "uvicorn.access" and isinstance(record.args, tuple):
            entry |= dict(zip(_ACCESS_FIELDS, record.args, strict=False))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Plain lines for a terminal, with a run's context appended when the record has it."""

    def __init__(self, process: str | None = None) -> None:
        role = "" if process is None else f"{process} "
        super().__init__(f"%(asctime)s %(levelname)s {role}%(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The record's line with its control characters (a newline a `log` task or a
        target wrote) escaped, so no message can forge the lines after it; a traceback,
        appended after this, keeps its lines."""
        line = _escaped(super().formatMessage(record))
        context = " ".join(f"{f}={getattr(record, f)}" for f in RUN_FIELDS if hasattr(record, f))
        return f"{line} [{_escaped(context)}]" if context else line


def _escaped(text: str) -> str:
    return "".join(_CONTROLS.get(char, char) for char in text)


_CONTROLS = {chr(code): repr(chr(code))[1:-1] for code in (*range(32), 127) if code != 9}


def configure_logging(
    level: str, log_format: Literal["json", "text"] | None, process: str | None = None
) -> None:
    """Route every logger, uvicorn's too, through one root handler on stderr."""
    chosen = log_format or ("text" if sys.stderr.isatty() else "json")
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter(process) if chosen == "json" else TextFormatter(process)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
