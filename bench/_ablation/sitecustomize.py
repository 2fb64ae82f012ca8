"""bench/api_rps.py --creates-at-once: the API's creates answered without Redis.

Put on the API process's PYTHONPATH by that option, never installed. Once the first
batch of creates has run for real (the request the benchmark's GETs read), each
batch of POST /ondemandvm's creates is answered ``created`` without its round trip to
Redis: the POST's own Python and the HTTP layer stay, the round trip and Redis's work
go. What the ratio to /healthz would be if the round trip cost nothing: a bound, not
the API's behaviour.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

TARGET = "vmpool.api.create_batch"


def _patch(module: ModuleType) -> None:
    batches = module.CreateBatches
    real = batches._execute
    ran = {"real": 0}

    async def _execute(self: Any, calls: Sequence[Any]) -> list[Any]:
        if ran["real"] < 1:
            ran["real"] += 1
            return list(await real(self, calls))
        return [[1, "created", 1] for _ in calls]

    batches._execute = _execute


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())
