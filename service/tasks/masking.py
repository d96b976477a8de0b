"""Masking what a target echoes of a job's secrets, in every form a target may echo them.

A target that echoes a request back (an httpbin, a debugging proxy, an error page quoting
the Authorization header) shows the secret to whoever reads the run: the exact bytes, but
also as a JSON string escapes them (`"` and `\\`, non-ASCII as `\\uXXXX`; once, or twice
for a JSON document quoted inside another), as a URL encodes them, in base64 (a Basic
credential, a JWT segment, at any of the three alignments a base64 text can hold it), and
in another case. Each form is masked as `***`, wherever it stands in the body or a shown
header.
"""

import base64
import json
import re
from collections.abc import Iterable, Iterator
from urllib.parse import quote, quote_plus

MASK = b"***"


class Masker:
    """Replaces every form of the given secrets by `***` (empty secrets are ignored)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        forms = {form for secret in secrets if secret for form in _forms(secret.encode())}
        # The longest first: a form that contains another is masked whole.
        ordered = sorted(forms, key=len, reverse=True)
        self.margin = max(map(len, ordered), default=0)
        self._pattern = (
            re.compile(b"|".join(map(re.escape, ordered)), re.IGNORECASE) if ordered else None
        )

    def masked(self, data: bytes) -> bytes:
        return data if self._pattern is None else self._pattern.sub(MASK, data)

    def masked_text(self, value: str) -> str:
        return self.masked(value.encode()).decode("utf-8", "replace")


def _forms(secret: bytes) -> Iterator[bytes]:
    text = secret.decode("utf-8", "replace")
    for cased in {text, text.upper(), text.lower()}:  # IGNORECASE folds ASCII only
        yield cased.encode()
        for ascii_only in (True, False):
            escaped = json.dumps(cased, ensure_ascii=ascii_only)[1:-1]
            yield escaped.encode()
            # A JSON document quoted inside another (a log line, an error's `detail`).
            yield json.dumps(escaped, ensure_ascii=ascii_only)[1:-1].encode()
    yield secret
    yield quote(secret, safe="").encode()
    yield quote_plus(secret, safe="").encode()
    yield from _base64_cores(secret)


def _base64_cores(secret: bytes) -> Iterator[bytes]:
    """The part of the secret's base64 that is the same wherever in a longer text it
    starts: for each of the three alignments, the characters that encode secret bytes
    only (standard and URL-safe alphabets)."""
    for lead in range(3):
        encoded = base64.b64encode(bytes(lead) + secret)
        start = -(-lead * 4 // 3)  # characters touched by the lead bytes
        end = (lead + len(secret)) * 4 // 3  # characters wholly made of secret bytes
        core = encoded[start:end]
        if len(core) >= 4:
            yield core
            yield core.replace(b"+", b"-").replace(b"/", b"_")
