"""The configuration: one YAML file in vmpooler's format, validated up front."""

from vmpool.config.model import *  # noqa: F403
from vmpool.config.model import __all__  # noqa: F401
