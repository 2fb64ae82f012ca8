"""vmpooler's extra config files, merged into the main file as vmpooler merges them.

vmpooler (``Vmpooler.config``) adds to its config file the files that ``:config:
extra_config`` names: a comma-separated list of paths, which the ``EXTRA_CONFIG``
environment variable replaces. Each is merged in turn with the deep_merge gem's
``Hash#deep_merge`` (it keeps what the main file has):

- a mapping merges key by key, recursively;
- a list gets the extra file's items it lacks, after its own, duplicates dropped
  (``:pools:`` grows by the extra file's pools);
- any other value: the main file's wins, unless it is absent, null or false.

An extra file's own ``extra_config`` is not followed. Config text given in
``VMPOOLER_CONFIG`` has no extra file, as in vmpooler: a warning then names the one
ignored.

A relative path is relative to the file that names it (``EXTRA_CONFIG``'s: to the working
directory), as ``:auth: users_file`` is. A key the merge drops (the main file gives it a
value already) is a warning naming both files.

Keys lose their leading colon before merging (:func:`strip_colons`): ``:pools:`` and
``pools:`` are the same key here, as everywhere in vmpool.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vmpool.config.errors import ConfigError, one_line
from vmpool.providers.options import show

__all__ = ["EXTRA_CONFIG_KEY", "LoadFile", "strip_colons", "with_extra_files"]

EXTRA_CONFIG_KEY = "extra_config"
# Reads and parses one YAML file; a ConfigError naming it when it cannot.
LoadFile = Callable[[str], Any]


def strip_colons(value: Any, source: str, path: str = "") -> Any:
    """``value`` with one leading colon taken off every mapping key, recursively.

    ConfigError when a key is not text, or is given twice (``:name:`` and ``name:``)."""
    if isinstance(value, list):
        return [strip_colons(item, source, f"{path}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    written: dict[str, Any] = {}
    for raw_key, item in value.items():
        if isinstance(raw_key, bool) or not isinstance(raw_key, (str, int)):
            raise ConfigError(
                source, path or "top level", f"keys must be strings, got {show(raw_key)}"
            )
        key = str(raw_key)
        key = key[1:] if key.startswith(":") else key
        full = f"{path}.{key}" if path else key
        if key in out:
            raise ConfigError(
                source, full, f"given twice (as {show(written[key])} and {show(raw_key)})"
            )
        written[key] = raw_key
        out[key] = strip_colons(item, source, full)
    return out


def with_extra_files(
    top: dict[str, Any],
    *,
    source: str,
    env: Mapping[str, str],
    load: LoadFile | None,
    base_dir: Path | None,
) -> tuple[dict[str, Any], list[str]]:
    """``top`` (colons stripped) with its extra files merged in, and the warnings.

    ``load`` None: the config is text, not a file, and reads no extra file."""
    config = top.get("config")
    config = config if isinstance(config, dict) else {}
    given = config.pop(EXTRA_CONFIG_KEY, None)
    variable = (env.get("EXTRA_CONFIG") or "").strip()
    if not variable and given is None:
        return top, []
    named_as = "environment EXTRA_CONFIG" if variable else f"config.{EXTRA_CONFIG_KEY}"
    if load is None:
        return top, [
            f"{source}: {named_as}: ignored: config text has no extra files (as in vmpooler)"
        ]
    if variable:
        paths = _paths(variable, Path.cwd())
    else:
        if not isinstance(given, str):
            raise ConfigError(
                source, named_as, f"must be file paths separated by commas, got {show(given)}"
            )
        paths = _paths(given, base_dir or Path.cwd())
    warnings: list[str] = []
    for path in paths:
        extra = strip_colons(load(path), path)
        if extra is None:
            continue
        if not isinstance(extra, Mapping):
            raise ConfigError(
                path, "top level", f"must be a mapping of sections, got {show(extra)}"
            )
        nested = extra.get("config")
        if isinstance(nested, dict) and nested.pop(EXTRA_CONFIG_KEY, None) is not None:
            warnings.append(f"{path}: config.{EXTRA_CONFIG_KEY}: not followed (as in vmpooler)")
        for key, kept, ignored in _merge(top, extra, ""):
            warnings.append(
                f"{path}: {key}: {show(ignored)} ignored: {source} (or an earlier extra file)"
                f" gives {show(kept)}, and an extra file only adds (as in vmpooler)"
            )
    return top, [one_line(w) for w in warnings]


def _paths(text: str, base: Path) -> list[str]:
    paths = [part.strip() for part in text.split(",") if part.strip()]
    return [os.path.normpath(base / path) for path in paths]


def _merge(dest: dict[str, Any], extra: Mapping[str, Any], path: str) -> list[tuple[str, Any, Any]]:
    """Merge ``extra`` into ``dest`` as deep_merge's ``deep_merge`` does.

    Returns (key path, value kept, value ignored) for each value of ``extra`` dropped."""
    dropped: list[tuple[str, Any, Any]] = []
    for key, value in extra.items():
        full = f"{path}.{key}" if path else key
        kept = dest.get(key)
        if value is None:
            continue
        if kept is None or kept is False:
            dest[key] = value
        elif isinstance(value, Mapping) and isinstance(kept, dict):
            dropped += _merge(kept, value, full)
        elif isinstance(value, list) and isinstance(kept, list):
            dest[key] = _union(kept, value)
        elif kept != value:
            dropped.append((full, kept, value))
    return dropped


def _union(first: list[Any], second: list[Any]) -> list[Any]:
    """Ruby's ``first | second``: the items of both in order, each once."""
    out: list[Any] = []
    for item in [*first, *second]:
        if item not in out:
            out.append(item)
    return out
