"""The configuration keys as Markdown, for docs/migrating-from-vmpooler.md.

Sources, so the page says what the code reads:

- the settings models (:mod:`vmpool.config.settings`)
- each provider class's options and pool keys (:mod:`vmpool.providers.registry`)
- vmpooler's key facts (:mod:`vmpool.config.vmpooler_keys`).

``tests/test_docs_migration.py`` fails when the page and the code part. To write the
page's block again::

    python -m vmpool.config.keys_doc docs/migrating-from-vmpooler.md
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from vmpool.config.quota_settings import QuotaEntry, QuotasSection
from vmpool.config.settings import AuthSection, ConfigSection, PoolSection, RedisSection, Schedule
from vmpool.config.vmpooler_keys import (
    AUTH_IGNORED,
    CONFIG_IGNORED,
    CONFIG_IGNORED_PREFIXES,
    CONFIG_REMOVED,
    ENVIRONMENT,
    IGNORED_SECTIONS,
    POOL_IGNORED,
    POOL_IGNORED_PREFIXES,
    PROVIDER_IGNORED,
    REDIS_IGNORED,
    SCHEDULE_KEY_ALIASES,
)
from vmpool.config.vmpooler_limits import LIMITS
from vmpool.providers.registry import PROVIDER_CLASSES, NoPoolOptions

__all__ = ["BEGIN", "END", "keys_markdown", "rewrite"]

BEGIN: Final = "<!-- begin generated keys (vmpool/config/keys_doc.py) -->"
END: Final = "<!-- end generated keys -->"


def _default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None or (isinstance(value, (str, tuple, list, set, frozenset, dict)) and not value):
        return "-"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (tuple, list, set, frozenset)):
        return "`[" + ", ".join(str(item) for item in value) + "]`"
    return f"`{value}`"


def _meaning(model: type[BaseModel], name: str) -> str:
    text = model.model_fields[name].description or ""
    return text.split(". Unit: ")[0].replace("|", "\\|").replace("\n", " ")


def _unit(model: type[BaseModel], name: str) -> str:
    extra = model.model_fields[name].json_schema_extra
    unit = extra.get("unit") if isinstance(extra, dict) else None
    return str(unit) if unit else ""


def _table(model: type[BaseModel], skip: Iterable[str] = ()) -> list[str]:
    rows = ["| key | unit | default | what it is |", "|---|---|---|---|"]
    for name in model.model_fields:
        if name in skip:
            continue
        rows.append(
            f"| `{name}` | {_unit(model, name)} | {_default(model, name)} |"
            f" {_meaning(model, name)} |"
        )
    return rows


def _names(names: Iterable[str], prefixes: Iterable[str] = ()) -> str:
    shown = [f"`{name}`" for name in sorted(names)]
    shown += [f"`{prefix}*`" for prefix in prefixes]
    return ", ".join(shown) or "none"


def _read_keys() -> list[str]:
    out = ["### The keys vmpool reads", ""]
    sections: list[tuple[str, type[BaseModel], tuple[str, ...]]] = [
        ("`:config:`", ConfigSection, ()),
        ("each entry of `:pools:`", PoolSection, ("provider_options",)),
        ("`:redis:`", RedisSection, ()),
        ("`:auth:`", AuthSection, ()),
        ("`:schedule:` (vmpool's: seconds between the periodic jobs)", Schedule, ()),
        ("`:quotas:` (vmpool's: quotas per user, request priorities)", QuotasSection, ()),
        ("`:quotas:` `default:` and each entry of `users:`", QuotaEntry, ()),
    ]
    for title, model, skip in sections:
        out += [f"#### {title}", "", *_table(model, skip), ""]
    return out


def _provider_keys() -> list[str]:
    out = [
        "### Each provider class's keys",
        "",
        "Under `:providers:` (`provider_class` names the class; default: the entry's"
        " name), and the keys a pool of that class may carry for it.",
        "",
    ]
    for name, implementation in PROVIDER_CLASSES.items():
        out += [f"#### `{name}`", "", *_table(implementation.options), ""]
        if implementation.pool_options is not NoPoolOptions:
            out += [f"Pool keys for `{name}`:", "", *_table(implementation.pool_options), ""]
    return out


def _vmpooler_keys() -> list[str]:
    renamed = [
        f"| `:schedule:` `{old}` (an earlier vmpool name) | `{new}` |"
        for old, new in SCHEDULE_KEY_ALIASES.items()
    ]
    removed = [f"| `:config:` `{key}` | {text} |" for key, text in CONFIG_REMOVED.items()]
    env = [f"| `{variable}` | `:{section}:` `{key}` |" for variable, section, key in ENVIRONMENT]
    return [
        "### vmpooler's keys vmpool accepts and ignores",
        "",
        "A vmpooler config loads as it is: these keys are read and ignored, without a"
        " warning (any other unknown key is a warning naming it), except on a pool: a"
        " vmpooler pool key its provider's class reads (its pool keys above: a cloud's"
        " `zone`, `amisize`, `subnetwork_name`, ...) is honoured, and one it does not is a"
        " warning naming the key and the class.",
        "",
        "| where | keys |",
        "|---|---|",
        f"| top-level sections | {_names(IGNORED_SECTIONS)} |",
        f"| `:config:` | {_names(CONFIG_IGNORED, CONFIG_IGNORED_PREFIXES)} |",
        "| each pool (but a key its provider's class reads, above, is read) |"
        f" {_names(POOL_IGNORED, POOL_IGNORED_PREFIXES)} |",
        f"| `:redis:` | {_names(REDIS_IGNORED)} |",
        f"| each provider | {_names(PROVIDER_IGNORED)} |",
        f"| `:auth:` | {_names(AUTH_IGNORED)} |",
        "",
        "### vmpooler 3.8/3.9's circuit breaker, adaptive timeout and rate limiter",
        "",
        "Read as vmpool's own setting where the meaning is the same; where it is not, a"
        " value that would change what vmpooler does is a warning naming the key.",
        "",
        "| `:config:` key | in vmpool |",
        "|---|---|",
        *[f"| `{key}` | {what} |" for key, what in LIMITS.items()],
        "",
        "### Renamed and removed keys",
        "",
        "| key | now |",
        "|---|---|",
        *renamed,
        *removed,
        "",
        "### Environment variables that override the file",
        "",
        "| variable | overrides |",
        "|---|---|",
        *env,
    ]


def keys_markdown() -> str:
    """The page's generated block, markers included."""
    lines = [BEGIN, "", *_read_keys(), *_provider_keys(), *_vmpooler_keys(), "", END]
    return "\n".join(lines)


def rewrite(page: Path) -> bool:
    """Put the block in ``page`` in place of the one there. True when it changed."""
    text = page.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = head + keys_markdown() + tail
    if new == text:
        return False
    page.write_text(new, encoding="utf-8")
    return True


if __name__ == "__main__":  # pragma: no cover - the doc's own maintenance command
    for argument in sys.argv[1:]:
        print(f"{argument}: {'rewritten' if rewrite(Path(argument)) else 'already current'}")
