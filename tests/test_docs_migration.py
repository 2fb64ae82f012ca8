"""docs/migrating-from-vmpooler.md says what the code reads: its key tables are the ones
vmpool/config/keys_doc.py writes from the settings models, the provider classes and
vmpool/config/vmpooler_keys.py, so a key added to any of them (a provider's placement
key, vSphere's) fails here until the page shows it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from vmpool.config import vmpooler_keys
from vmpool.config.keys_doc import keys_markdown
from vmpool.config.settings import AuthSection, ConfigSection, PoolSection, RedisSection, Schedule
from vmpool.config.vmpooler_limits import LIMITS
from vmpool.providers.registry import PROVIDER_CLASSES

PAGE = Path(__file__).resolve().parent.parent / "docs" / "migrating-from-vmpooler.md"
REWRITE = "python -m vmpool.config.keys_doc docs/migrating-from-vmpooler.md"


def test_the_page_shows_the_keys_as_the_code_has_them() -> None:
    assert keys_markdown() in PAGE.read_text(encoding="utf-8"), f"rewrite it: {REWRITE}"


def test_every_key_vmpool_knows_is_on_the_page() -> None:
    text = PAGE.read_text(encoding="utf-8")
    models: list[type[BaseModel]] = [
        ConfigSection,
        PoolSection,
        RedisSection,
        AuthSection,
        Schedule,
    ]
    for cls in PROVIDER_CLASSES.values():
        models += [cls.options, cls.pool_options]
    known = {name for model in models for name in model.model_fields} - {"provider_options"}
    ignored = set().union(
        vmpooler_keys.IGNORED_SECTIONS,
        vmpooler_keys.CONFIG_IGNORED,
        vmpooler_keys.POOL_IGNORED,
        vmpooler_keys.REDIS_IGNORED,
        vmpooler_keys.PROVIDER_IGNORED,
        vmpooler_keys.AUTH_IGNORED,
        vmpooler_keys.CONFIG_REMOVED,
        vmpooler_keys.SCHEDULE_KEY_ALIASES,
        LIMITS,
    )
    variables = {variable for variable, _, _ in vmpooler_keys.ENVIRONMENT}
    missing = sorted(key for key in known | ignored | variables if f"`{key}`" not in text)
    assert not missing, f"not on the page: {missing}; {REWRITE}"
