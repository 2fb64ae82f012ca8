"""Turning "N VMs of these names" into a request: name resolution and backend choice.

Shared by the HTTP API and `vmpool request create`, so both accept the same names,
enforce the same maximum, and pick backends the same way (vmpooler's
``evaluate_template_aliases``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vmpool.config import Config
from vmpool.state.records import Slot


@dataclass
class RequestRejected(Exception):
    """Why a request cannot be accepted. Nothing has been written.

    ``bad_templates`` lists names that are neither a pool nor an alias (vmpooler's 404).
    ``maximum`` is set when a count exceeds ``max_ondemand_instances_per_request``, or
    the sum of the counts ``max_ondemand_instances_total`` (vmpooler's 403).
    """

    message: str
    bad_templates: tuple[str, ...] = ()
    maximum: int | None = None

    def __str__(self) -> str:
        return self.message


def choose_pools(config: Config, name: str, count: int, rng: random.Random) -> dict[str, int]:
    """Pick a backend pool for each of ``count`` instances asked for under ``name``.

    Candidates: ``name`` if it is a pool, plus every pool listing it as an alias. When
    more than one candidate exists and every candidate's clone_target has a
    ``backend_weight``, the pick is weighted by it (weight 0: never picked). Otherwise
    it is uniformly random. Returns pool -> count, in order of first pick.
    """
    candidates = config.resolve_name(name)
    if not candidates:
        return {}
    if len(candidates) == 1:  # nothing to pick: no draw (the system's rng reads the OS)
        return {candidates[0]: count}
    weights: list[float] = []
    for pool_name in candidates:
        target = config.pools[pool_name].clone_target
        if target is not None and target in config.backend_weight:
            weights.append(float(config.backend_weight[target]))
    weighted = len(candidates) > 1 and len(weights) == len(candidates) and sum(weights) > 0
    picks: dict[str, int] = {}
    for _ in range(count):
        if weighted:
            pick = rng.choices(candidates, weights=weights, k=1)[0]
        else:
            pick = rng.choice(candidates)
        picks[pick] = picks.get(pick, 0) + 1
    return picks


def check_names(config: Config, names: Iterable[str]) -> None:
    """RequestRejected listing, in order, every name that is neither a pool nor an alias.

    The one check of requested names. The API calls it before it parses the counts
    (vmpooler answers an unknown name before a bad count)."""
    unknown = [name for name in names if not config.resolve_name(name)]
    if unknown:
        raise RequestRejected(
            f"unknown pool or alias: {', '.join(unknown)}", bad_templates=tuple(unknown)
        )


def plan_slots(config: Config, counts: Mapping[str, int], rng: random.Random) -> list[Slot]:
    """Slots for a request of ``counts`` (name -> positive count).

    RequestRejected when a name is unknown (all unknown names are listed), a count is
    over the maximum per name, or the counts add up to more than the maximum of one
    request."""
    check_names(config, counts)
    check_counts(config, counts)
    slots = []
    for name, count in counts.items():
        for pool, n in choose_pools(config, name, count, rng).items():
            slots.append(Slot(name, pool, n))
    return slots


# The most plans one Plans keeps: a fleet asks for a few shapes of request (past it, the
# kept ones are dropped and the plans made again).
PLANS_KEPT = 256


class Plans:
    """:func:`plan_slots` for one config and rng, each plan that picks nothing made once.

    When every name selects one pool, the plan is a function of the counts alone: no
    backend to pick, no draw. The API is asked for the same few shapes over and over
    (``{"debian": 1}``) and keeps those plans; a plan that picks among pools draws every
    time, and a refused one raises every time."""

    def __init__(self, config: Config, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self._fixed: dict[tuple[tuple[str, int], ...], tuple[Slot, ...]] = {}

    def slots(self, counts: Mapping[str, int]) -> tuple[Slot, ...]:
        """The slots of ``counts``, as :func:`plan_slots` makes them."""
        key = tuple(counts.items())
        fixed = self._fixed.get(key)
        if fixed is not None:
            return fixed
        slots = tuple(plan_slots(self.config, counts, self.rng))
        if all(len(self.config.resolve_name(name)) == 1 for name in counts):
            if len(self._fixed) >= PLANS_KEPT:
                self._fixed.clear()
            self._fixed[key] = slots
        return slots


def check_counts(config: Config, counts: Mapping[str, int]) -> None:
    """Refuse counts over the maximum per name or per request.

    RequestRejected (vmpooler's 403 wording) when one count is over the maximum per
    name, or all of them together over the maximum of one request: per name alone, a
    request naming many pools (or one pool by many aliases) could ask for any number."""
    for maximum, asked in (
        (config.max_ondemand_instances_per_request, max(counts.values(), default=0)),
        (config.max_ondemand_instances_total, sum(counts.values())),
    ):
        if asked > maximum:
            raise RequestRejected(
                f"requested amount of instances exceeds the maximum {maximum}", maximum=maximum
            )


def parse_pool_counts(args: tuple[str, ...] | list[str]) -> dict[str, int]:
    """Parse ``POOL=N`` arguments (vmfloaty's form) into name -> count.

    ``POOL=N`` arguments (vmfloaty's form) -> name -> count. A bare name means 1 and a
    repeated name adds up. ValueError names the bad argument."""
    counts: dict[str, int] = {}
    for arg in args:
        name, sep, raw = arg.partition("=")
        if not name:
            raise ValueError(f"{arg!r}: expected POOL=N")
        if not sep:
            raw = "1"
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{arg!r}: the count must be a positive integer")
        counts[name] = counts.get(name, 0) + int(raw)
    if not counts:
        raise ValueError("name at least one POOL=N")
    return counts
