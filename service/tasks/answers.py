"""What the http task keeps of a target's answer: the run's output.

A run shows its last attempt's answer (GET /v1/runs/{id}): the status, the response
headers worth reading (`SHOWN_HEADERS`), and the first `output_bytes` of the body, as
text when it is text and base64 otherwise. A target that echoes the job's secrets back
shows them as `***`, in the body and the headers alike, in any form it may echo them
(`service.tasks.masking`).
"""

import base64
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from pydantic import JsonValue

from service.tasks.masking import Masker

DEFAULT_OUTPUT_BYTES = 16 * 1024
MAX_OUTPUT_BYTES = 1024 * 1024
# The response headers a run's output shows; the rest are the target's business.
SHOWN_HEADERS = (
    "content-type",
    "content-length",
    "content-encoding",
    "location",
    "retry-after",
    "www-authenticate",
    "x-request-id",
    "request-id",
)
_TEXT_SUBTYPES = ("json", "xml", "javascript", "x-www-form-urlencoded", "yaml", "csv")


@dataclass(frozen=True)
class Answer:
    """A target's answer as the run keeps it: `body` is its start (secrets masked),
    `size` the bytes received, `cut` whether more were received than kept, `capped`
    whether the body was longer than the read limit (reading stopped there)."""

    status: int
    headers: dict[str, str]
    body: bytes
    size: int
    cut: bool
    capped: bool


async def read_answer(
    response: aiohttp.ClientResponse, limit: int, keep: int, masker: Masker
) -> Answer:
    """Read the body (never decoded), at most `limit` bytes of it, keeping the first
    `keep` with every form of the secrets masked (read the longest form's length further,
    so one cut at the edge is masked whole)."""
    size, kept = 0, bytearray()
    async for chunk in response.content.iter_any():
        kept += chunk[: max(0, keep + masker.margin - len(kept))]
        size += len(chunk)
        if size > limit:
            break
    body = masker.masked(bytes(kept))
    shown = {
        name: masker.masked_text(response.headers[name])
        for name in SHOWN_HEADERS
        if name in response.headers
    }
    capped = size > limit
    return Answer(response.status, shown, body[:keep], min(size, limit), size > keep, capped)


def answer_output(answer: Answer) -> dict[str, JsonValue]:
    """The run's output for `answer`."""
    content_type = answer.headers.get("content-type")
    text = _text(answer.body, content_type)
    body, encoding = (text, "text") if text is not None else (_base64(answer.body), "base64")
    headers: Mapping[str, JsonValue] = answer.headers
    return {
        "status": answer.status,
        "headers": dict(headers),
        "content_type": content_type,
        "body": body,
        "encoding": encoding,
        "bytes": answer.size,
        "truncated": answer.cut,
    }


def _text(body: bytes, content_type: str | None) -> str | None:
    """The body as text, if it is text (by its content type, or UTF-8 without one); a
    character cut at the edge of what was kept is left out."""
    if content_type is not None and not _textual(content_type):
        return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(body) - 3:
            return None
        return body[: error.start].decode("utf-8")


def _textual(content_type: str) -> bool:
    kind, _, subtype = content_type.split(";", maxsplit=1)[0].strip().lower().partition("/")
    return kind == "text" or any(word in subtype for word in _TEXT_SUBTYPES)


def _base64(body: bytes) -> str:
    return base64.b64encode(body).decode("ascii")
