"""The two ways a command fails: one line on stderr and an exit status, never a traceback.

* :class:`CliError`: bad usage or input, exit status 2.
* :class:`CliFailure`: a failed check or a failed request, exit status 1.

Kept apart from the context so that the root group (``main.py``) needs nothing heavier
than click to turn an unexpected error into one line.
"""

from __future__ import annotations

from typing import IO, Any

import click

__all__ = ["CliError", "CliFailure", "OneLineCommand", "OneLineGroup", "one_line"]


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) folded to one space."""
    return " ".join(str(text).split()) or "(no message)"


class CliError(click.ClickException):
    """Bad usage or input: ``vmpool: error: <message>`` on stderr, one line, exit 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"vmpool: error: {self.format_message()}", err=True, file=file)


class CliFailure(CliError):
    """A failed check or a failed request: the same one line, exit 1."""

    exit_code = 1


class OneLineCommand(click.Command):
    """A command whose bad usage is one line and exit 2, like every other failure.

    For commands read by machines or in `kubectl describe pod`, and operators' commands
    whose bad input must say one thing.
    """

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            raise CliError(f"{self.name}: {exc.format_message()}") from None


class OneLineGroup(click.Group):
    """A group whose unknown subcommand is one line and exit 2."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            raise CliError(f"{self.name}: {exc.format_message()}") from None
