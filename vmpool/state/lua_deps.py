"""A store script's helpers cut to those its body reaches: its fixed cost per call.

Every call of a script runs its whole text: each ``local function`` of the helpers it
is composed with is made again (a closure) and each table built, before the body runs.
:func:`prune` keeps, of a helper text's top-level definitions, only those the body
names, and those they name, transitively (in their order, so each still sees what it
saw). Done once, when the store composes a script (vmpool.state.store_scripts).

A helper text is a sequence of top-level definitions, ``local function NAME`` ...
``end`` and ``local NAME[, NAME] = ...`` (a table's closing brace at column 0), with
comments and blank lines between them: nothing else runs at the top level of a helper,
so a definition left out changes nothing but the names in scope. :func:`definitions`
refuses any other top-level statement, and a top-level value that runs a command. A
name is taken as referenced wherever it appears as an identifier outside comments and
strings (a field or a parameter of the same spelling keeps a definition it does not
need: harmless).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

__all__ = ["Definition", "definitions", "identifiers", "prune"]

_LOCAL_FUNCTION: Final = re.compile(r"local\s+function\s+([A-Za-z_]\w*)")
_LOCAL_NAMES: Final = re.compile(r"local\s+([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=")
# A comment to its line's end, a long string or comment, a quoted string, a name.
_TOKEN: Final = re.compile(
    r"""--\[(=*)\[.*?\]\1\]|\[(=*)\[.*?\]\2\]|--[^\n]*|'(?:\\.|[^'\\\n])*'"""
    r"""|"(?:\\.|[^"\\\n])*"|([A-Za-z_]\w*)""",
    re.S,
)
# What a top-level value must not do: it would not run when its definition is left out.
_WRITES: Final = re.compile(r"\bredis\.p?call\b|\btable\.(?:remove|insert)\b")
# Lines at column 0 that continue the definition above them (its closing line).
_CLOSERS: Final = ("end", "}")


@dataclass(frozen=True)
class Definition:
    """One top-level definition of a helper text: the names it binds, its source."""

    names: frozenset[str]
    text: str
    function: bool  # a ``local function``: its name is in scope in its own body
    uses: frozenset[str]  # the identifiers after ``local NAME =`` / ``local function NAME``


def identifiers(source: str) -> set[str]:
    """The identifiers of Lua ``source`` outside comments and strings (keywords too)."""
    return {m.group(3) for m in _TOKEN.finditer(source) if m.group(3)}


def definitions(helpers: str) -> list[Definition]:
    """The top-level definitions of ``helpers``, in order, each with the comment above it.

    ValueError for a top-level line that is neither a definition's start, its closing
    ``end`` or ``}``, a comment nor blank: such a statement would run on every call
    whatever the body needs, so it is not cut silently.
    """
    out: list[Definition] = []
    head: re.Match[str] | None = None
    lines: list[str] = []  # the definition's: its comment, its first line, the rest
    pending: list[str] = []  # comments and blank lines before the next definition
    for line in helpers.splitlines(keepends=True):
        if line[:1].isspace() or line.rstrip() in _CLOSERS:
            (lines if head else pending).append(line)
        elif line.startswith("--") or not line.strip():
            pending.append(line)
        elif m := _LOCAL_FUNCTION.match(line) or _LOCAL_NAMES.match(line):
            if head:
                out.append(_definition(head, lines))
            head, lines, pending = m, [*pending, line], []
        else:
            raise ValueError(f"not a top-level definition in a helper text: {line.strip()!r}")
    if head:
        out.append(_definition(head, lines))
    return out


def _definition(head: re.Match[str], lines: list[str]) -> Definition:
    """The definition whose first line ``head`` matched, of source ``lines``.

    ValueError for a value that writes (a Redis command, ARGV changed): left out, its
    write would be lost.
    """
    text = "".join(lines)
    names = frozenset(n.strip() for n in head.group(1).split(","))
    rest = text[text.index(head.group(0)) + len(head.group(0)) :]
    function = head.re is _LOCAL_FUNCTION
    if not function and _WRITES.search(rest):
        raise ValueError(f"a helper's top-level value runs a command: {head.group(0)!r}")
    return Definition(names, text, function, frozenset(identifiers(rest)))


@lru_cache(maxsize=512)
def prune(helpers: str, body: str) -> str:
    """The definitions of ``helpers`` that ``body`` reaches, in their order, as source.

    A name refers to its latest definition before the referring one (a function's own
    name to itself: recursion); the body's names to the latest of all. Cached: a store
    made again (a CLI command, a test) composes its scripts without the pass (about 2 ms
    a script).
    """
    defs = definitions(helpers)
    latest: dict[str, int] = {}
    sees: list[dict[str, int]] = []  # what each definition's names resolve to
    for i, d in enumerate(defs):
        sees.append(dict(latest))
        latest.update(dict.fromkeys(d.names, i))
        if d.function:
            sees[i].update(dict.fromkeys(d.names, i))
    keep: set[int] = set()
    todo = [latest[n] for n in identifiers(body) if n in latest]
    while todo:
        i = todo.pop()
        if i not in keep:
            keep.add(i)
            todo.extend(sees[i][n] for n in defs[i].uses if n in sees[i])
    return "".join(d.text for i, d in enumerate(defs) if i in keep)
