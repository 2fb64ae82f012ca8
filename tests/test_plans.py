"""The API's plans (vmpool/lifecycle/plan.py ``Plans``): a plan that picks nothing is made
once and kept; one that picks among pools is drawn every time; a refusal is never kept.

Config: vmpooler's ondemandvm_spec.rb (tests/apihelp.py): ``pool1`` is served by one pool,
``pool2`` by two (the pool of that name, and ``pool1`` by its alias).
"""

from __future__ import annotations

from collections import Counter
from random import Random

import pytest

from vmpool.lifecycle import plan
from vmpool.lifecycle.plan import Plans, RequestRejected, plan_slots

from apihelp import spec_config


class NoDraws(Random):
    def random(self) -> float:
        raise AssertionError("drew from the rng")

    def getrandbits(self, k: int) -> int:
        raise AssertionError("drew from the rng")


def test_a_plan_that_picks_nothing_is_made_once_and_kept() -> None:
    """Proves: the same counts get the very slots made the first time (no second plan),
    equal to what plan_slots makes, and no draw from the rng."""
    config = spec_config()
    plans = Plans(config, NoDraws())
    first = plans.slots({"pool1": 2, "poolone": 1})
    assert plans.slots({"pool1": 2, "poolone": 1}) is first
    assert first == tuple(plan_slots(config, {"pool1": 2, "poolone": 1}, NoDraws()))


def test_a_plan_that_picks_among_pools_is_drawn_every_time() -> None:
    """Proves: a name two pools serve is picked anew on each plan (both pools come up in
    100 plans of one instance), as plan_slots picks it: such a plan is never kept."""
    config = spec_config(weights={})  # no backend weights: a uniform pick
    assert len(config.resolve_name("pool2")) == 2
    plans = Plans(config, Random(5))
    picked = Counter(plans.slots({"pool2": 1})[0].pool for _ in range(100))
    assert set(picked) == set(config.resolve_name("pool2"))


def test_a_refused_plan_raises_every_time() -> None:
    """Proves: an unknown name and a count over the maximum are refused on every ask,
    not only the first (a refusal is not kept as a plan)."""
    config = spec_config()
    plans = Plans(config, Random(1))
    too_many = config.max_ondemand_instances_per_request + 1
    for counts in ({"nope": 1}, {"pool1": too_many}):
        for _ in range(2):
            with pytest.raises(RequestRejected):
                plans.slots(counts)


def test_the_plans_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Proves: past PLANS_KEPT shapes the kept plans are dropped (memory bounded by
    the bound, not by how many shapes clients send), and made again when asked."""
    monkeypatch.setattr(plan, "PLANS_KEPT", 2)
    plans = Plans(spec_config(), NoDraws())
    first = plans.slots({"pool1": 1})
    assert plans.slots({"pool1": 1}) is first
    plans.slots({"pool1": 2})
    plans.slots({"pool1": 3})  # the third shape: the kept two are dropped
    again = plans.slots({"pool1": 1})
    assert again == first and again is not first
