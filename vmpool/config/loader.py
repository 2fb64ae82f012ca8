"""Loading a configuration, one step after another, each problem a one-line ConfigError.

The steps: the file, its YAML, vmpooler's format, the settings, the resolved
:class:`~vmpool.config.Config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from vmpool.config.build import build
from vmpool.config.demo import DEMO_CONFIG_YAML, DEMO_SOURCE
from vmpool.config.errors import ConfigError
from vmpool.config.model import Config
from vmpool.config.settings import ConfigFile
from vmpool.config.vmpooler import read, where
from vmpool.providers.options import problems

__all__ = [
    "VMPOOLER_VARIABLES",
    "demo_config",
    "load_config",
    "named_by_environment",
    "parse_config",
]

# vmpooler's variables naming its config: the text itself, or a file.
VMPOOLER_VARIABLES = ("VMPOOLER_CONFIG", "VMPOOLER_CONFIG_FILE")


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Config:
    """Load and validate a config file.

    - ``path`` None means ``env["VMPOOL_CONFIG"]`` when set; else vmpooler's variables:
      ``VMPOOLER_CONFIG`` (the config as YAML text), else ``VMPOOLER_CONFIG_FILE`` (a
      file); else the built-in demo. A variable passed over is a warning.
    - ``env`` (default ``os.environ``) supplies vmpooler's overriding variables.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    given = {name: (environ.get(name) or "").strip() for name in VMPOOLER_VARIABLES}
    used: str | None = None
    if path is None:
        path = (environ.get("VMPOOL_CONFIG") or "").strip() or None
    if path is None and given["VMPOOLER_CONFIG"]:
        source = "environment VMPOOLER_CONFIG"
        data = _load_yaml(environ["VMPOOLER_CONFIG"], source)
        notes = _passed_over(given, source, "VMPOOLER_CONFIG")
        return parse_config(data, source=source, env=environ, notes=notes, files=False)
    if path is None and given["VMPOOLER_CONFIG_FILE"]:
        path, used = given["VMPOOLER_CONFIG_FILE"], "VMPOOLER_CONFIG_FILE"
    if path is None:
        data = _load_yaml(DEMO_CONFIG_YAML, DEMO_SOURCE)
        return parse_config(data, source=DEMO_SOURCE, env=environ)
    source = os.fspath(path)
    data = _load_yaml(_read_text(source), source)
    notes = _passed_over(given, source, used)
    return parse_config(data, source=source, env=environ, notes=notes)


def named_by_environment(env: Mapping[str, str] | None = None) -> bool:
    """Whether vmpooler's variables name a config (the CLI then uses it, not the fleet's)."""
    environ: Mapping[str, str] = os.environ if env is None else env
    return any((environ.get(name) or "").strip() for name in VMPOOLER_VARIABLES)


def _passed_over(given: Mapping[str, str], source: str, used: str | None) -> tuple[str, ...]:
    """A warning for each of vmpooler's variables set but not the one used."""
    return tuple(
        f"environment {name}: ignored: the config is {source}"
        for name, value in given.items()
        if value and name != used
    )


def demo_config() -> Config:
    """The built-in demo config, without environment overrides."""
    return parse_config(_load_yaml(DEMO_CONFIG_YAML, DEMO_SOURCE), source=DEMO_SOURCE, env={})


def parse_config(
    data: Any,
    *,
    source: str,
    env: Mapping[str, str] | None = None,
    notes: tuple[str, ...] = (),
    files: bool = True,
) -> Config:
    """Validate already-parsed YAML (``source`` names it in messages).

    ``notes``: warnings said before the file's own. ``files`` False: the config is text,
    which reads no extra file (vmpooler's VMPOOLER_CONFIG)."""
    base_dir = Path(source).parent if files and Path(source).is_file() else None
    file = read(
        data,
        source=source,
        env=os.environ if env is None else env,
        load=_load_file if files else None,
        base_dir=base_dir,
    )
    try:
        settings = ConfigFile.model_validate(file.sections)
    except ValidationError as exc:
        loc, problem = problems(exc)[0]
        raise ConfigError(source, where(loc, file.origins), problem) from None
    return build(settings, source=source, warnings=notes + file.warnings)


def _load_file(path: str) -> Any:
    """One extra config file, parsed."""
    return _load_yaml(_read_text(path), path)


def _read_text(source: str) -> str:
    try:
        return Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, None, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(source, None, "is a directory, not a config file") from None
    except PermissionError:
        raise ConfigError(source, None, "permission denied") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, None, f"not UTF-8 text (bad byte at offset {exc.start})"
        ) from None
    except OSError as exc:
        raise ConfigError(source, None, exc.strerror or str(exc)) from None


def _load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(source, where, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, None, f"invalid YAML: {exc}") from None
