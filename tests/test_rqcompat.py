"""The RQ adapter (workers/rqcompat.py) holds against the installed RQ and rq-scheduler.

What this proves: every private name the adapter relies on (:data:`PRIVATE_NAMES`) is
where it was, with the parameters the adapter calls or overrides it with (an instance
attribute: set by its owner's ``__init__``); the list names every underscore name the
adapter's source touches; and the public names the adapter adds are RQ's nowhere, so
none of them silently shadows one of RQ's. An RQ whose private names moved fails here,
not in a worker. The check itself fails on a name taken away, a changed signature and
an attribute no longer set (monkeypatched RQ), so it can fail.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rq import Queue, SimpleWorker, Worker
from rq.worker.base import BaseWorker
from rq_scheduler import Scheduler

from workers import rqcompat
from workers.rqcompat import PRIVATE_NAMES, PrivateName, SchedulerHooks, WorkerHooks

SOURCE = Path(rqcompat.__file__)


def moved(names: tuple[PrivateName, ...]) -> list[str]:
    """What of ``names`` the installed RQ no longer has as the adapter relies on it."""
    problems: list[str] = []
    for private in names:
        where = f"{getattr(private.owner, '__name__', private.owner)}.{private.name}"
        if private.parameters is None:
            if private.name not in _set_in_init(private.owner):
                problems.append(f"{where}: no longer set by __init__")
            continue
        found = getattr(private.owner, private.name, None)
        if found is None:
            problems.append(f"{where}: gone")
            continue
        parameters = " ".join(inspect.signature(found).parameters)
        if parameters != private.parameters:
            problems.append(f"{where}: parameters ({parameters}), not ({private.parameters})")
    return problems


def _set_in_init(owner: type) -> set[str]:
    """The attributes ``owner.__init__`` assigns on ``self``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(owner.__init__)))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


def test_every_private_name_the_adapter_relies_on_is_in_place() -> None:
    assert moved(PRIVATE_NAMES) == []


def test_a_name_taken_away_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(Queue, "_prepare_for_queue")
    assert moved(PRIVATE_NAMES) == ["Queue._prepare_for_queue: gone"]


def test_a_changed_signature_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(self: Any, exc: Exception, pubsub: Any) -> None:
        """RQ's handler without its thread argument."""

    monkeypatch.setattr(BaseWorker, "_pubsub_exception_handler", handler)
    assert moved(PRIVATE_NAMES) == [
        "BaseWorker._pubsub_exception_handler: parameters (self exc pubsub),"
        " not (self exc pubsub pubsub_thread)"
    ]


def test_an_attribute_no_longer_set_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        """An __init__ that no longer sets the stop flag nor the pop order."""
        self.name = "w"

    monkeypatch.setattr(BaseWorker, "__init__", init)
    assert moved(PRIVATE_NAMES) == [
        "BaseWorker._stop_requested: no longer set by __init__",
        "BaseWorker._ordered_queues: no longer set by __init__",
    ]


def test_the_list_names_every_private_name_the_adapter_touches() -> None:
    """An underscore name the adapter's source uses is one of PRIVATE_NAMES (the adapter
    defines none of its own), so none escapes the check above."""
    used = set()
    for node in ast.walk(ast.parse(SOURCE.read_text(encoding="utf-8"))):
        name = node.attr if isinstance(node, ast.Attribute) else None
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            name = node.name
        if name and name.startswith("_") and not name.startswith("__"):
            used.add(name)
    assert used == {private.name for private in PRIVATE_NAMES}


HOOKS = [(WorkerHooks, (BaseWorker, Worker, SimpleWorker)), (SchedulerHooks, (Scheduler,))]


def clashes(hooks: type, rq_classes: tuple[type, ...]) -> set[str]:
    """The public names ``hooks`` adds that one of ``rq_classes`` has too (a class
    attribute, or one its __init__ sets)."""
    added = {name for name in vars(hooks) if not name.startswith("_")}
    assert added
    return {
        name
        for rq_class in rq_classes
        for name in added
        if hasattr(rq_class, name) or name in _set_in_init(rq_class)
    }


@pytest.mark.parametrize(("hooks", "rq_classes"), HOOKS)
def test_the_adapters_public_names_are_not_rqs(hooks: type, rq_classes: tuple[type, ...]) -> None:
    """A name the adapter adds that RQ also had would replace RQ's without a word."""
    assert clashes(hooks, rq_classes) == set()


def test_a_clash_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SimpleWorker, "stop_requested", False, raising=False)
    assert clashes(WorkerHooks, (BaseWorker, Worker, SimpleWorker)) == {"stop_requested"}
