"""Log records: JSON lines carrying run context; the access log in the same shape."""

import json
import logging
import sys

from service.logs import JsonFormatter, TextFormatter


def record(
    name: str, msg: str, args: tuple[object, ...] = (), **extra: object
) -> logging.LogRecord:
    made = logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(made, key, value)
    return made


RUN = {
    "job": "nightly",
    "run_id": "r-1",
    "scheduled_for": "2026-11-29T19:00:05+00:00",
    "runner": "pod-a",
}


def test_json_line_carries_run_context() -> None:
    line = JsonFormatter().format(record("tickgate.run", "reindexed %d tables", (3,), **RUN))
    entry = json.loads(line)
    assert entry["message"] == "reindexed 3 tables"
    assert entry["level"] == "INFO"
    assert {k: entry[k] for k in RUN} == RUN


def test_access_log_is_structured_json() -> None:
    access = record(
        "uvicorn.access", '%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5", "GET", "/v1/jobs", "1.1", 200)
    )
    entry = json.loads(JsonFormatter().format(access))
    assert entry["method"] == "GET"
    assert entry["path"] == "/v1/jobs"
    assert entry["status"] == 200
    assert entry["message"] == '127.0.0.1:5 - "GET /v1/jobs HTTP/1.1" 200'


def test_text_lines_append_run_context() -> None:
    line = TextFormatter().format(record("tickgate.run", "done", **RUN))
    assert line.endswith(
        "[job=nightly run_id=r-1 scheduled_for=2026-11-29T19:00:05+00:00 runner=pod-a]"
    )
    assert "[" not in TextFormatter().format(record("other", "plain"))


def test_text_lines_escape_what_could_forge_another_line() -> None:
    """A `log` task's message (or a target's text in one) cannot start a line of its own
    in the text format (#42); a traceback keeps its lines."""
    forged = "done\n2026-12-07 00:00:00 ERROR tickgate: forged\r\x1b[2K"
    line = TextFormatter().format(record("tickgate.run", forged, job="a\nb"))
    assert not {"\n", "\r", "\x1b"} & set(line), line
    assert "done\\n2026-12-07" in line, line
    assert "job=a\\nb" in line, line
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord("t", logging.ERROR, __file__, 1, "x", (), sys.exc_info())
    assert TextFormatter().format(failed).count("\n") >= 2  # the traceback's own lines
