"""The body guard's nesting depth: the same answer as a byte-by-byte scan, on any bytes."""

import json
import random

import pytest

from service.api.guards import json_depth


def scanned_depth(body: bytes) -> int:
    """The reference: one byte at a time, tracking strings and their escapes."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            escaped, in_string = (False, True) if escaped else (byte == 0x5C, byte != 0x22)
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"", 0),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'{"a": "[[[[{{"}', 1),
        (b'{"a\\"[[": [[1]]}', 3),
        (b'["\\\\", [[]]]', 3),
        (b'["open string [[[[', 1),
        (b'["ends in a backslash \\', 1),
    ],
)
def test_brackets_inside_strings_do_not_count(body: bytes, depth: int) -> None:
    assert json_depth(body) == depth == scanned_depth(body)


def test_agrees_with_a_byte_scan_on_random_bytes() -> None:
    chooser = random.Random(7)
    alphabet = b'[]{}"\\a,:'
    for _ in range(5000):
        body = bytes(chooser.choice(alphabet) for _ in range(chooser.randint(0, 40)))
        assert json_depth(body) == scanned_depth(body), body


def test_agrees_with_a_byte_scan_on_json() -> None:
    chooser = random.Random(11)

    def value(level: int) -> object:
        if level > 5 or chooser.random() < 0.3:
            return chooser.choice(['q"uote\\d [{', "\\", "é", 1, None])
        if chooser.random() < 0.5:
            return [value(level + 1) for _ in range(chooser.randint(0, 3))]
        return {f"k{index}[": value(level + 1) for index in range(chooser.randint(0, 3))}

    for _ in range(1000):
        body = json.dumps(value(0)).encode()
        assert json_depth(body) == scanned_depth(body), body
