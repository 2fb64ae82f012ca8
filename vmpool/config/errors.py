"""The one kind of error a configuration has: ``<file>: <key path>: <problem>``, one line."""

from __future__ import annotations

__all__ = ["ConfigError", "one_line"]


def one_line(text: str) -> str:
    """``text`` with every run of whitespace, newlines included, made one space."""
    return " ".join(text.split())


class ConfigError(Exception):
    """A configuration problem. ``str(err)`` is one line: ``<file>: <key path>: <problem>``."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        super().__init__(source, key, problem)
        self.source = source
        self.key = key
        self.problem = problem

    def __str__(self) -> str:
        parts = [self.source, self.key, self.problem] if self.key else [self.source, self.problem]
        return one_line(": ".join(parts))
