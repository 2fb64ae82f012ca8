"""The project is self-contained: its README, changelog, docs, manifests, code and every
`--help` text point only inside the repository, and every relative link in the docs
resolves.

A newcomer on a fresh clone has only the repository: a reference to a file outside it
(``../shared/...``, a path on the machine it was written on, a contract kept elsewhere)
is a dead end. This fails on any such reference anyone adds, and on a Markdown link to
a file that does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from vmpool.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
# What points outside the repository: the sibling folder of the team's notes, absolute
# paths of the machine it was written on, the contract and design kept there.
OUTSIDE = re.compile(r"\.\./shared|/work/|\bCONTRACT\.md\b|\bDESIGN\.md\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _files() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "Dockerfile", ROOT / "Makefile"]
    found += sorted((ROOT / "docs").rglob("*.md"))
    for folder, patterns in (
        ("deploy", ("*.yaml", "*.yml", "*.json")),
        ("vmpool", ("*.py", "*.lua")),
        ("workers", ("*.py", "*.lua")),
        ("bench", ("*.py",)),
        ("tests", ("*.py", "*.sh")),
    ):
        for pattern in patterns:
            found += sorted((ROOT / folder).rglob(pattern))
    return [path for path in found if path.is_file() and path != Path(__file__).resolve()]


def _commands(command: click.Command, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            yield from _commands(sub, (*path, name))


def test_no_file_points_outside_the_repository() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, "references outside the repository:\n" + "\n".join(hits)


def test_no_help_text_points_outside_the_repository() -> None:
    runner = CliRunner()
    checked = 0
    for path in _commands(cli, ()):
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert not OUTSIDE.search(result.output), (path, result.output)
        checked += 1
    assert checked > 20  # every group and command was walked, the lazy ones included


@pytest.mark.parametrize(
    "doc",
    [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda p: p.name,
)
def test_every_relative_link_resolves(doc: Path) -> None:
    text = doc.read_text()
    dead = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor in the page itself
        if not (doc.parent / target.split("#", 1)[0]).exists():
            dead.append(target)
    assert not dead, f"{doc.name}: links to missing files: {dead}"


# A repository path named in a comment or docstring: a doc page or a module's file.
NAMED_PATH = re.compile(
    r"\b((?:docs|vmpool|workers|tests|bench|deploy)/[\w./-]*\w\.(?:md|py|lua))\b"
)


def test_every_path_named_in_code_exists() -> None:
    """A comment or docstring that names ``docs/x.md`` or ``vmpool/x.py`` names a file
    that exists (one renamed or removed leaves a dead reference). test_layout.py's
    made-up trees are not the repository's."""
    dead = [
        f"{path.relative_to(ROOT)}:{number}: {named}"
        for path in _files()
        if path.suffix in (".py", ".lua") and path.name != "test_layout.py"
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for named in NAMED_PATH.findall(line)
        if not (ROOT / named).exists()
    ]
    assert not dead, "paths that do not exist:\n" + "\n".join(dead)


def test_readme_keeps_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
