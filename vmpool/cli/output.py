"""How the commands print: tables with a header, times as ISO 8601 (UTC) or "in 3.0 h".

One way for every command, so that ``vmpool vm list``, ``vmpool pools`` and ``vmpool
request history`` read alike. JSON output (``--json``) is the commands' own: numbers
stay numbers (times in epoch seconds) and a missing value is ``null``, never ``"-"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone

import click

__all__ = ["EMPTY", "echo_table", "iso", "relative", "table"]

# What a table shows for a missing value (JSON has null).
EMPTY = "-"


def iso(epoch: float | None, *, millis: bool = False) -> str:
    """``epoch`` (seconds) as ISO 8601 in UTC: 2026-12-03T16:13:55Z. EMPTY for None."""
    if epoch is None:
        return EMPTY
    when = datetime.fromtimestamp(epoch, tz=timezone.utc)
    if millis:
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def relative(seconds: float | None) -> str:
    """A span from now: "in 3.0 h", "in 45 min", "12 s ago". EMPTY for None."""
    if seconds is None:
        return EMPTY
    size = abs(seconds)
    if size < 90:
        span = f"{size:.0f} s"
    elif size < 90 * 60:
        span = f"{size / 60:.0f} min"
    elif size < 48 * 3600:
        span = f"{size / 3600:.1f} h"
    else:
        span = f"{size / 86400:.1f} d"
    return f"in {span}" if seconds >= 0 else f"{span} ago"


def _cell(value: object) -> str:
    if value is None or value == "":
        return EMPTY
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or EMPTY
    return str(value)


def table(rows: Iterable[Mapping[str, object]], columns: Sequence[str]) -> list[str]:
    """The rows as lines under a header (the column names in capitals), aligned."""
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    header = [column.upper() for column in columns]
    widths = [max(len(text) for text in column) for column in zip(header, *cells, strict=False)]

    def line(texts: Sequence[str]) -> str:
        return "  ".join(text.ljust(width) for text, width in zip(texts, widths, strict=True))

    return [line(header).rstrip()] + [line(texts).rstrip() for texts in cells]


def echo_table(rows: Iterable[Mapping[str, object]], columns: Sequence[str]) -> None:
    for text in table(rows, columns):
        click.echo(text)
