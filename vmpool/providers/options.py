"""The pieces options models are made of, so that every problem reads as one line.

A provider class declares its options as a pydantic model (the registry pairs the two).
The configuration builds its own settings from the same pieces. Pydantic's own error
texts ("Input should be a valid number, unable to parse string as a number") are never
shown to a user: a field built with :func:`expect` fails with ``must be <what>, got
<the value as written>``, and :func:`problems` reads any ``ValidationError`` back as
``(location, one-line problem)`` pairs.

Coercion is ours, not pydantic's lax mode, because that mode takes ``true`` for 1 and
``" 5 "`` for 5 in places vmpool never did: :func:`real` takes numbers only,
:func:`number` numbers or numeric strings (environment variables are strings),
:func:`integer` whole numbers (``2.0`` too), :func:`strict_integer` ints only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import ErrorDetails, PydanticCustomError

__all__ = [
    "ERROR_TYPE",
    "Coerce",
    "expect",
    "integer",
    "invalid",
    "key_path",
    "number",
    "problem",
    "problems",
    "real",
    "show",
    "strict_integer",
]

# The pydantic error type of every problem raised through invalid().
ERROR_TYPE: Final = "vmpool"

Coerce = Callable[[Any], Any]


def show(value: Any) -> str:
    """A value for an error message: short, one line."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, Mapping):
        return "a mapping"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def invalid(problem: str) -> PydanticCustomError:
    """An error pydantic reports as ``problem``, word for word."""
    # The text goes in as context, not as the template, so braces in it stay braces.
    return PydanticCustomError(ERROR_TYPE, "{problem}", {"problem": problem})


def expect(what: str, coerce: Coerce | None = None) -> WrapValidator:
    """A validator whose every failure reads ``must be <what>, got <value>``.

    Coercion and bounds failures alike. Place it after the type's ``Field`` bounds in
    ``Annotated[...]`` so that it wraps them."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value if coerce is None else coerce(value))
        except (TypeError, ValueError):  # ValidationError is a ValueError
            raise invalid(f"must be {what}, got {show(value)}") from None

    return WrapValidator(validate)


def real(value: Any) -> float:
    """A number as YAML gives one. Not a bool (``yes`` is not 1%), not a string."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("not a number")
    return float(value)


def number(value: Any) -> float:
    """A number, or a string holding one (as environment variables are)."""
    if isinstance(value, str):
        return float(value.strip())
    return real(value)


def integer(value: Any) -> int:
    """A whole number: an int, an integral float, or a string holding an int."""
    if isinstance(value, bool):
        raise TypeError("not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    raise TypeError("not an integer")


def strict_integer(value: Any) -> int:
    """An int as YAML gives one: not a bool, a float or a string."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("not an integer")
    return value


# Pydantic's structural errors, for fields not built with expect(): the shape expected.
_SHAPES: Final = {
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "mapping_type": "a mapping",
    "list_type": "a list",
    "tuple_type": "a list",
    "set_type": "a list",
    "frozen_set_type": "a list",
    "too_long": "a shorter list",
    "too_short": "a longer list",
    "string_type": "a string",
}


def problem(error: ErrorDetails) -> str:
    """One error of a ``ValidationError`` as vmpool words it."""
    if error["type"] == ERROR_TYPE:
        return error["msg"]
    if error["type"] == "missing":
        return "missing"
    if error["type"] == "extra_forbidden":
        return "unknown key"
    shape = _SHAPES.get(error["type"])
    if shape is not None:
        return f"must be {shape}, got {show(error['input'])}"
    return f"invalid value {show(error['input'])}"


def key_path(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """``("pools", 1, "size")`` as ``pools[1].size``, after ``prefix`` when given."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    return path


def problems(exc: ValidationError) -> list[tuple[tuple[int | str, ...], str]]:
    """Every error of ``exc`` as ``(location, one-line problem)``, in pydantic's order."""
    return [(tuple(error["loc"]), problem(error)) for error in exc.errors()]
