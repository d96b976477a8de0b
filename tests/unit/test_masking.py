"""What a target echoes of a secret is masked in every form it may echo it (#42)."""

import base64
import json
from urllib.parse import quote, quote_plus

import pytest

from service.tasks.masking import Masker

AWKWARD = ['Bearer s3"cr\\et/+%~=Q', "p@ss w0rd&=?", "ünïcode-sëcret", "a" * 3]


def echoes(secret: str) -> list[tuple[bytes, bytes]]:
    """Each form a target may echo `secret` in, with the part of it no answer may keep
    (of a base64 text, the characters that encode the secret's bytes alone)."""
    raw = secret.encode()
    escaped = json.dumps(secret)[1:-1]
    whole = [
        raw,
        secret.upper().encode(),
        secret.lower().encode(),
        escaped.encode(),
        json.dumps(secret, ensure_ascii=False)[1:-1].encode(),
        json.dumps(escaped)[1:-1].encode(),  # a JSON document quoted in another
        quote(secret, safe="").encode(),
        quote_plus(secret).encode(),
    ]
    encoded = [base64.b64encode(b"x" * lead + raw) for lead in range(3)]
    encoded += [base64.urlsafe_b64encode(b"~" * lead + raw) for lead in range(3)]
    return [(form, form) for form in whole] + [(form, form[4:-4]) for form in encoded]


@pytest.mark.parametrize("secret", AWKWARD)
def test_no_echoed_form_survives(secret: str) -> None:
    masker = Masker([secret])
    for echo, core in echoes(secret):
        if not core:
            continue  # a base64 text too short to hold a whole group of the secret alone
        shown = masker.masked(b'{"said": "' + echo + b'", "more": 1}')
        assert b"***" in shown, echo
        assert core not in shown, (echo, shown)
        assert shown.endswith(b'", "more": 1}'), shown


def test_nothing_else_is_touched() -> None:
    masker = Masker(["s3cret-value", ""])
    assert masker.masked(b"an answer with no secret") == b"an answer with no secret"
    assert Masker([]).masked(b"anything") == b"anything"
    assert masker.masked_text("X-Request-Id: s3cret-value") == "X-Request-Id: ***"
