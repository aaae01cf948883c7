"""JSON documents drawn from fuzz bytes, for the targets that read JSON (the server's request bodies,
a run directory's manifests and log).

:class:`Draw` picks from the input; :func:`value` draws a value, mostly an awkward one (the extremes of
the number types, lone surrogates, deep nesting, wrong kinds); :func:`dump` writes a document as JSON
text, including what ``json.dumps`` never writes: ``NaN``, ``Infinity``, 400-digit numbers, lone
surrogate escapes, duplicate keys and nesting too deep to parse.
"""

from __future__ import annotations

import json
from typing import Any


class Raw(str):
    """JSON text written as is."""


class Draw:
    """Draws choices from the fuzz input (zeros once it runs out)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        b = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return b

    def pick(self, options: list | tuple) -> Any:
        return options[self.byte() % len(options)]

    def rare(self) -> bool:
        """True about one time in eight."""
        return self.byte() >= 224

    def rest(self) -> bytes:
        out = self.data[self.pos:]
        self.pos = len(self.data)
        return out

    def text(self, limit: int = 24) -> str:
        """A short string of the input's bytes (latin-1: every byte a character)."""
        n = self.byte() % limit
        out = self.data[self.pos:self.pos + n].decode("latin-1")
        self.pos += n
        return out


NUMBERS: tuple = (0, 1, -1, 2, 7, 16, 128, 4096, 2**31 - 1, 2**31, 2**53 + 1, 2**63, 2**64, -(2**63), 10**30,
                  0.0, -0.0, 0.5, 1.5, 2.0, 1e-7, 5e-324, -5e-324, 1e308, -1e308, 2.2250738585072014e-308,
                  Raw("1e400"), Raw("-1e400"), Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("9" * 400),
                  Raw("1" + "0" * 5000), Raw("0.000000000000000000000000000000001"), Raw("-0"), Raw("1E+2"))
STRINGS: tuple = ("", "hello", "hi there", "\ud800", "a\udfffb", "\ud83d", "\U0001f680", "\x00", "<|endoftext|>",
                  "café naïve 日本語", "\n\n", " " * 300, "x" * 5000, "{{ raise_exception('x') }}", "system",
                  "user", "assistant", "tool", "text", "json_object", "none", "auto", "length", "stop")


def value(d: Draw, depth: int = 0) -> Any:
    """An arbitrary JSON value, weighted towards the awkward ones."""
    kind = d.byte() % 12
    if kind < 3:
        return d.pick(NUMBERS)
    if kind < 5:
        return d.pick(STRINGS) if d.byte() & 1 else d.text()
    if kind == 5:
        return d.pick((None, True, False))
    if kind == 6 and depth < 4:
        return [value(d, depth + 1) for _ in range(d.byte() % 4)]
    if kind == 7 and depth < 4:
        return {d.pick(STRINGS) if d.byte() & 1 else d.text(8): value(d, depth + 1) for _ in range(d.byte() % 4)}
    if kind == 8:
        n = d.pick((2, 64, 65, 1000, 30_000))
        return Raw("[" * n + "]" * n)
    return d.byte() - 128


def dump(doc: Any) -> str:
    """``doc`` as JSON text; :class:`Raw` values are written as they are, other strings with ``\\uXXXX``
    escapes (lone surrogates included), dict entries in order (:class:`Pairs` may repeat a key)."""
    if isinstance(doc, Raw):
        return str(doc)
    if isinstance(doc, str):
        return json.dumps(doc, ensure_ascii=True)
    if isinstance(doc, Pairs):
        return "{" + ", ".join(f"{dump(str(k))}: {dump(v)}" for k, v in doc) + "}"
    if isinstance(doc, dict):
        return dump(Pairs(doc.items()))
    if isinstance(doc, list):
        return "[" + ", ".join(dump(v) for v in doc) + "]"
    return json.dumps(doc)


class Pairs(list):
    """An object's entries in order: the same key may come twice."""
