"""The configuration: one YAML file in vmpooler's format, validated up front.

Modules:

- :mod:`~vmpool.config.settings`: every setting's type, bounds, default, unit and
  meaning, as pydantic models of the file. :mod:`~vmpool.config.fields` holds the types.
- :mod:`~vmpool.config.vmpooler`: vmpooler's format. Leading colons, ignored and unknown
  keys, old key names, environment overrides.
- :mod:`~vmpool.config.build`: the resolved :class:`Config`. Seconds, inherited
  defaults, references, provider options through the provider registry.
- :mod:`~vmpool.config.loader`: file -> YAML -> the above.
- :mod:`~vmpool.config.public`: the config's public form, every setting and no secret
  (``vmpool config show`` prints it, the fleet publishes it:
  :mod:`~vmpool.config.published`).
- :mod:`~vmpool.config.demo`: the built-in demo.
- :mod:`~vmpool.config.schema`: the file's JSON Schema.

Errors: a problem with the file is a :class:`ConfigError` of one line,
``<file>: <key path>: <problem>``. A key vmpool does not know is a warning
(:attr:`Config.warnings`), never a crash.
"""

from vmpool.config.build import default_redis_options
from vmpool.config.demo import DEMO_CONFIG_YAML, DEMO_SOURCE
from vmpool.config.errors import ConfigError
from vmpool.config.ldap import LdapConfig
from vmpool.config.loader import demo_config, load_config, parse_config
from vmpool.config.model import AuthConfig, Config, PoolConfig, ProviderConfig
from vmpool.config.public import public_form
from vmpool.config.redis_url import mask_url_password, validate_redis_url
from vmpool.config.schema import json_schema
from vmpool.config.settings import Schedule
from vmpool.config.vmpooler_keys import SCHEDULE_KEY_ALIASES

__all__ = [
    "DEMO_CONFIG_YAML",
    "DEMO_SOURCE",
    "SCHEDULE_KEY_ALIASES",
    "AuthConfig",
    "Config",
    "ConfigError",
    "LdapConfig",
    "PoolConfig",
    "ProviderConfig",
    "Schedule",
    "default_redis_options",
    "demo_config",
    "json_schema",
    "load_config",
    "mask_url_password",
    "parse_config",
    "public_form",
    "validate_redis_url",
]
