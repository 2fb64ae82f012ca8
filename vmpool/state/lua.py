"""The one loader of vmpool's Lua scripts.

Every script lives in a ``.lua`` file beside the module that calls it (the store's in
``vmpool/state/scripts/``, the simulated provider's in ``vmpool/providers/``, the
workers' in ``workers/``), and each file opens with a header comment: its keys,
arguments, return values and the invariant it protects. Modules read them through
:func:`read_script` only, so there is one way a script reaches Redis: the text of the
file (plus, for the store, the rendered transition table), registered with redis-py's
``register_script`` (EVALSHA, loading on NOSCRIPT).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["read_script"]


@cache
def read_script(package: str, name: str) -> str:
    """The text of ``name`` (``foo.lua``) shipped in ``package`` (a dotted package name,
    e.g. ``"vmpool.state.scripts"``). Cached: a script file never changes at run time."""
    if not name.endswith(".lua"):
        raise ValueError(f"not a Lua script file name: {name!r}")
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")
