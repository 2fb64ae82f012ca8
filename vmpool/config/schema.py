"""The JSON Schema of the configuration file (``vmpool config schema`` prints it)."""

from __future__ import annotations

from typing import Any

from vmpool.config.settings import ConfigFile
from vmpool.providers.registry import PROVIDER_CLASSES

__all__ = ["json_schema"]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a config file, keys written without their leading colon.

    Every setting has its description, default and bounds, and ``unit`` where the file
    gives a duration (vmpooler's minutes and hours included). A ``:providers:`` entry is
    described by its class's options model, from the provider registry.
    """
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **ConfigFile.model_json_schema(),
        "title": "vmpool configuration",
    }
    schema["properties"]["providers"]["additionalProperties"] = {
        "anyOf": [_provider_entry(name) for name in PROVIDER_CLASSES]
    }
    return schema


def _provider_entry(name: str) -> dict[str, Any]:
    options = PROVIDER_CLASSES[name].options.model_json_schema()
    options["title"] = f"{name} provider"
    options["properties"] = {
        "provider_class": {
            "type": "string",
            "description": "The implementation (default: the instance's name)",
            "const": name,
        },
        **options.get("properties", {}),
    }
    return options
