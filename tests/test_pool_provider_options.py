"""A pool's keys for its provider reach that provider, checked by the class's pool model.

vmpooler keeps provider-specific placement on the pool (vSphere's ``folder`` and
``datastore``, a cloud's ``subnet_id``): each provider class declares the pool keys it
reads (``ProviderClass.pool_options``), the configuration validates every pool's with
it (an error names the pool's key), and ``providers_from_config`` builds each instance
with the keys of the pools that use it, by pool name.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
import redis
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from vmpool.config import ConfigError, parse_config, public_form
from vmpool.providers import providers_from_config, registry
from vmpool.providers.simulated import SimulatedOptions, simulated_provider
from vmpool.state.keys import Keys


class PlacementPoolOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    folder: str
    datastore: str | None = None
    zone: str | None = Field(
        default=None, validation_alias=AliasChoices("zone", "availability_zone")
    )
    clone_target: str | None = None
    linked: bool = False


BUILT: list[Mapping[str, Mapping[str, Any]]] = []


def placed_provider(
    redis: redis.Redis,
    keys: Keys,
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    pools: Mapping[str, Mapping[str, Any]] | None = None,
) -> Any:
    BUILT.append(dict(pools or {}))
    return simulated_provider(redis, keys, name, options)


@pytest.fixture
def placed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider class ``placed`` that reads pool keys, beside the real ones."""
    classes = dict(registry.PROVIDER_CLASSES)
    classes["placed"] = registry.ProviderClass(
        "placed", SimulatedOptions, placed_provider, PlacementPoolOptions
    )
    monkeypatch.setattr(registry, "PROVIDER_CLASSES", MappingProxyType(classes))
    BUILT.clear()


def config(pool: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        ":config": {"clone_target": "cluster-default", **top},
        ":providers": {":vc": {"provider_class": "placed"}},
        ":pools": [{"name": "p1", "provider": ":vc", **pool}, {"name": "p2"}],
    }


def test_pool_keys_reach_the_provider(placed: None, redis_client: redis.Redis) -> None:
    cfg = parse_config(
        config({"folder": "ci/p1", "datastore": "ds1", "availability_zone": "az-b"}),
        source="t.yaml",
        env={},
    )
    pool = cfg.pools["p1"]
    # An alias is read as its field; a key shared with the pool's own settings takes
    # the pool's resolved value (config.clone_target here); defaults are filled in.
    assert dict(pool.provider_options) == {
        "folder": "ci/p1",
        "datastore": "ds1",
        "zone": "az-b",
        "clone_target": "cluster-default",
        "linked": False,
    }
    assert cfg.pools["p2"].provider_options == {}
    assert not [w for w in cfg.warnings if "folder" in w or "zone" in w]

    providers = providers_from_config(redis_client, Keys(), cfg)
    assert set(providers) == {"vc", "simulated"}
    # The instance is given the pools that use it, and only those.
    assert [b for b in BUILT if b] == [{"p1": dict(pool.provider_options)}]


def test_a_bad_pool_key_names_the_pool_and_key(placed: None) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(config({"folder": "f", "linked": "maybe"}), source="t.yaml", env={})
    assert "pools[0].linked" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_config(config({}), source="t.yaml", env={})
    assert "pools[0].folder" in str(err.value) and "missing" in str(err.value)


def test_keys_no_class_reads_are_warned_about(placed: None) -> None:
    cfg = parse_config(
        config({"folder": "f", "bogus": 1, "provider_options": {"folder": "x"}}),
        source="t.yaml",
        env={},
    )
    assert dict(cfg.pools["p1"].provider_options)["folder"] == "f"
    assert any("pools[0].bogus: unknown key" in w for w in cfg.warnings)
    assert any("pools[0].provider_options: unknown key" in w for w in cfg.warnings)
    # A pool of a class that reads no pool keys: the same key is unknown there.
    cfg = parse_config(
        {":pools": [{"name": "p", "folder": "f", "datastore": "d"}]}, source="t.yaml", env={}
    )
    assert cfg.pools["p"].provider_options == {}


def test_the_public_form_shows_them(placed: None) -> None:
    cfg = parse_config(config({"folder": "ci/p1"}), source="t.yaml", env={})
    public = public_form(cfg)["pools"][0]
    assert public["provider_options"]["folder"] == "ci/p1"
