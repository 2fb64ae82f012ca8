"""The JSON Schema of the configuration file (``vmpool config schema`` prints it)."""

from __future__ import annotations

from typing import Any

from vmpool.config.settings import ConfigFile
from vmpool.providers.registry import PROVIDER_CLASSES

__all__ = ["json_schema"]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a config file, keys written without their leading colon.

    Every setting has its description, default and bounds. ``unit`` is given where the file
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
    for definition in schema.get("$defs", {}).values():
        for prop in definition.get("properties", {}).values():
            _describe_range(prop)
    return schema


def _describe_range(prop: dict[str, Any]) -> None:
    """Append a bounded setting's range to its description, in the file's unit.

    The bounds themselves live in the field types (vmpool.config.fields).
    """
    bounded = [o for o in prop.get("anyOf", [prop]) if "maximum" in o]
    if not bounded or "description" not in prop:
        return
    low = bounded[0].get("minimum", bounded[0].get("exclusiveMinimum"))
    unit = f" {prop['unit']}" if "unit" in prop else ""
    prop["description"] += f" Range: {low:g} to {bounded[0]['maximum']:g}{unit}."


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
