"""`redocly lint` with its recommended rules finds nothing in the committed document
(tests/ts-client/redocly.yaml: `extends: [recommended]`, no rule turned off)."""

import json

from tests.support.npm import TS_CLIENT, run_tool

DOCUMENT = TS_CLIENT.parents[1] / "openapi" / "openapi.json"


def test_redocly_recommended_rules_find_no_error_and_no_warning() -> None:
    linted = run_tool("redocly", "lint", "--format", "json", str(DOCUMENT))
    assert linted.stdout.strip(), linted.stderr
    report = json.loads(linted.stdout)
    assert report["problems"] == [], json.dumps(report["problems"], indent=1)[:6000]
    assert report["totals"] == {"errors": 0, "warnings": 0, "ignored": 0}
    assert linted.returncode == 0, linted.stderr
