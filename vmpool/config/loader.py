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

__all__ = ["demo_config", "load_config", "parse_config"]


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Config:
    """Load and validate a config file.

    - ``path`` None means ``env["VMPOOL_CONFIG"]`` when set, else the built-in demo.
    - ``env`` (default ``os.environ``) supplies vmpooler's overriding variables.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    if path is None:
        from_env = environ.get("VMPOOL_CONFIG", "").strip()
        if not from_env:
            return parse_config(
                _load_yaml(DEMO_CONFIG_YAML, DEMO_SOURCE), source=DEMO_SOURCE, env=environ
            )
        path = from_env
    source = os.fspath(path)
    return parse_config(_load_yaml(_read_text(source), source), source=source, env=environ)


def demo_config() -> Config:
    """The built-in demo config, without environment overrides."""
    return parse_config(_load_yaml(DEMO_CONFIG_YAML, DEMO_SOURCE), source=DEMO_SOURCE, env={})


def parse_config(data: Any, *, source: str, env: Mapping[str, str] | None = None) -> Config:
    """Validate already-parsed YAML (``source`` names it in messages)."""
    file = read(data, source=source, env=os.environ if env is None else env)
    try:
        settings = ConfigFile.model_validate(file.sections)
    except ValidationError as exc:
        loc, problem = problems(exc)[0]
        raise ConfigError(source, where(loc, file.origins), problem) from None
    return build(settings, source=source, warnings=file.warnings)


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
