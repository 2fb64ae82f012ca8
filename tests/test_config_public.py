"""Every setting is in `vmpool config show` and in the fleet's published config, and no
secret is in either.

The settings are found by introspection: every field of :class:`Config` and of the
records it holds (pools, providers, auth and its LDAP settings, the Redis connection and
its durability, the schedule). A setting added to any of them tomorrow is checked here
without a change to this file. The check itself is shown to fail: every setting it finds,
left out of the form, is reported.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from pydantic import BaseModel

from vmpool.config import Config, load_config
from vmpool.config.published import publish_config
from vmpool.state.keys import Keys

from clihelp import run

# Every record present (auth, its LDAP settings, pools of two providers), every secret in
# each place a secret can be: provider options (top-level and nested), a pool's options
# (its dns section), the LDAP service account's password, the Redis URL's password, the
# users' password hashes.
FULL = """\
:providers:
  simulated: {boot_seconds: 0, seed: 2}
  aws:
    provider_class: ec2
    region: us-east-1
    access_key_id: AKID-PROVIDER-SECRET
    secret_access_key: provider-secret-access-key
    session_token: provider-session-token
    proxy: {password: provider-nested-password}
  vcenter:
    provider_class: vsphere
    server: vcenter.example.com
    username: vmpool
    password: provider-vsphere-password
:redis:
  url: redis://vmpool:redis-url-password@127.0.0.1:1/0
  key_prefix: full
  durability: none
:auth:
  provider: ldap
  users:
    jdoe: sha256$salt$0000000000000000000000000000000000000000000000000000000000000000
  admins: [ops]
  token_ttl: 2
  :ldap:
    host: ldap.example.com
    base: ou=people,dc=example,dc=com
    user_object: uid
    service_account_hash:
      :user_dn: cn=vmpool,dc=example,dc=com
      :password: ldap-bind-password
:config:
  vm_lifetime: 3
  backend_weight: {fleetpool: 2}
  experimental_features: true
  provider_circuit_failures: 7
:tagfilter: {project: '(.*)'}
:quotas:
  default: {max_vms: 20}
  users:
    jdoe: {max_vms: 2, max_cores: 8, priority: 1}
:pools:
  - {name: fleetpool, alias: [fp], domain: example.com, size: 1}
  - name: cloudpool
    provider: aws
    template: ami-12c6146b
    domain: vms.example.com
    dns: {driver: route53, key: AKID-DNS-POOL-SECRET, secret: dns-pool-secret, ttl: 60}
"""
SECRETS = (
    "AKID-PROVIDER-SECRET",
    "provider-secret-access-key",
    "provider-session-token",
    "provider-nested-password",
    "provider-vsphere-password",
    "AKID-DNS-POOL-SECRET",
    "dns-pool-secret",
    "ldap-bind-password",
    "redis-url-password",
    "sha256$salt",
)


@pytest.fixture
def full(tmp_path: Path) -> Path:
    path = tmp_path / "full.yaml"
    path.write_text(FULL)
    return path


# -- the check ------------------------------------------------------------------------------

Location = tuple[str | int, ...]


def _fields(cls: type) -> list[tuple[str, Any]]:
    """A record's fields and their types: a dataclass's, or a pydantic model's."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return [(name, f.annotation) for name, f in cls.model_fields.items()]
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]


def _is_record(hint: Any) -> bool:
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return True
    return dataclasses.is_dataclass(hint) and isinstance(hint, type)


def _record_in(hint: Any) -> tuple[type | None, bool]:
    """The record a field holds (``X``, ``X | None``, ``Mapping[str, X]``), if any, and
    whether it holds many of them (a mapping)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        present = [arg for arg in args if arg is not type(None)]
        return _record_in(present[0]) if len(present) == 1 else (None, False)
    if origin in (Mapping, dict) and len(args) == 2:
        record, _ = _record_in(args[1])
        return record, record is not None
    return (hint, False) if _is_record(hint) else (None, False)


@dataclasses.dataclass
class Check:
    """What a check of one form found: the settings missing, and where each one found is."""

    missing: list[str] = dataclasses.field(default_factory=list)
    found: list[Location] = dataclasses.field(default_factory=list)


def check_settings(cls: type, form: Mapping[str, Any], check: Check, at: Location = ()) -> Check:
    """Check that ``form`` holds every setting of the record ``cls``, and those of every
    record it holds (an empty one counts as missing: the config under test sets them all).

    The form's spellings: a mapping of records is a list of them, or a mapping keyed by
    their names; a record that is no mapping in the form is spelt flat beside it, as the
    file spells it: its first field under its own name, the others prefixed with it
    (``durability``, ``durability_replicas``)."""
    for name, hint in _fields(cls):
        where = ".".join(map(str, (*at, name)))
        if name not in form:
            check.missing.append(where)
            continue
        check.found.append((*at, name))
        record, many = _record_in(hint)
        value = form[name]
        if record is None:
            continue
        if value is None or (isinstance(value, (Mapping, list)) and not value):
            check.missing.append(f"{where} (empty)")
        elif many:
            for key, entry in _entries(value):
                check_settings(record, entry, check, (*at, name, key))
        elif isinstance(value, Mapping):
            check_settings(record, value, check, (*at, name))
        else:
            _check_flat(record, name, form, check, at)
    return check


def _entries(value: Any) -> Iterator[tuple[str | int, Mapping[str, Any]]]:
    if isinstance(value, list):
        yield from enumerate(value)
        return
    for key, entry in value.items():  # keyed by name: the key is the record's name
        yield key, {"name": key, **entry}


def _check_flat(
    record: type, name: str, form: Mapping[str, Any], check: Check, at: Location
) -> None:
    first, *others = (field for field, _ in _fields(record))
    spelt = {first: name} | {field: f"{name}_{field}" for field in others}
    flat = {field: form[key] for field, key in spelt.items() if key in form}
    inner = check_settings(record, flat, Check(), (*at, name))
    check.missing += inner.missing
    check.found += [(*at, spelt[str(loc[-1])]) for loc in inner.found if loc[-1] != first]


def missing_settings(form: Mapping[str, Any]) -> list[str]:
    return check_settings(Config, form, Check()).missing


# -- the two forms ----------------------------------------------------------------------------


def shown(path: Path, *options: str) -> Any:
    result = run("config", "show", "--config", str(path), *options)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "--json" in options else yaml.safe_load(result.stdout)


def published(client: redis.Redis, path: Path) -> tuple[Any, str]:
    """The form the fleet publishes for the config at ``path``, and the whole stored record."""
    config = load_config(path, env={})
    publish_config(client, config, publisher="test")
    stored = client.hgetall(Keys(config.key_prefix).fleet_config)
    return json.loads(stored["config"]), json.dumps(stored)


def test_config_show_json_has_every_setting(full: Path) -> None:
    assert missing_settings(shown(full, "--json")) == []


def test_the_published_config_has_every_setting(full: Path, redis_client: redis.Redis) -> None:
    form, _ = published(redis_client, full)
    assert missing_settings(form) == []


def test_config_show_and_the_published_config_are_one_form(
    full: Path, redis_client: redis.Redis
) -> None:
    """Proves: `config show --json`, `config show` (YAML) and the published form hold the
    same data, key for key."""
    form, _ = published(redis_client, full)
    assert shown(full, "--json") == form
    assert shown(full) == form


def test_no_secret_is_in_either_form(full: Path, redis_client: redis.Redis) -> None:
    """Proves: a secret in each place a secret can be is in neither output, and each place
    shows the mask instead (so the secret was there to be masked)."""
    _, stored = published(redis_client, full)
    text = run("config", "show", "--config", str(full))
    as_json = run("config", "show", "--config", str(full), "--json")
    for output in (stored, text.output, as_json.output):
        for secret in SECRETS:
            assert secret not in output
    form = shown(full, "--json")
    aws = form["providers"]["aws"]["options"]
    assert [aws[k] for k in ("access_key_id", "secret_access_key", "session_token")] == ["***"] * 3
    assert aws["proxy"] == {"password": "***"}
    assert form["providers"]["vcenter"]["options"]["password"] == "***"
    dns = form["pools"][1]["provider_options"]["dns"]
    assert (dns["key"], dns["secret"]) == ("***", "***")
    assert form["auth"]["ldap"]["service_password"] == "***"
    assert form["auth"]["users"] == ["jdoe"]
    assert form["redis_url"] == "redis://vmpool:***@127.0.0.1:1/0"


def test_a_sentinel_urls_passwords_are_masked(tmp_path: Path) -> None:
    path = tmp_path / "sentinel.yaml"
    path.write_text(
        ":redis:\n  sentinel:\n    master: mymaster\n    hosts: ['127.0.0.1:26379']\n"
        "    password: primary-password\n    sentinel_password: sentinel-password\n"
    )
    result = run("config", "show", "--config", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert "primary-password" not in result.output and "sentinel-password" not in result.output
    assert "***" in json.loads(result.stdout)["redis_url"]


# -- the check can fail -------------------------------------------------------------------------


def _delete(form: Any, location: Location) -> None:
    *path, last = location
    for key in path:
        form = form[key]
    del form[last]


def test_the_check_reports_each_setting_left_out(full: Path) -> None:
    """Proves the check is not vacuous: each of the settings it finds in the form (over
    sixty, at every depth), deleted from the form, is reported missing."""
    form = shown(full, "--json")
    check = check_settings(Config, form, Check())
    assert check.missing == []
    assert len(check.found) > 60
    for location in check.found:
        without = copy.deepcopy(form)
        try:
            _delete(without, location)
        except KeyError:  # a provider's name: its key in the form, not a field
            continue
        assert missing_settings(without), f"{location} deleted, not reported"


def test_the_check_reports_a_setting_added_to_config(full: Path) -> None:
    """Proves a setting added to Config is checked without a change here: a Config with
    one more field finds it missing from today's form."""
    tomorrow = dataclasses.make_dataclass(
        "Tomorrow",
        [("new_setting", int, dataclasses.field(default=0))],
        bases=(Config,),
        frozen=True,
    )
    assert check_settings(tomorrow, shown(full, "--json"), Check()).missing == ["new_setting"]


@dataclasses.dataclass(frozen=True)
class Inner:
    value: int


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner | None


def test_the_check_reports_a_record_it_cannot_look_into() -> None:
    """Proves: an optional record left empty is reported (the config under test must set
    every record, or their settings would go unchecked)."""
    assert check_settings(Outer, {"inner": None}, Check()).missing == ["inner (empty)"]
    assert check_settings(Outer, {"inner": {}}, Check()).missing == ["inner (empty)"]
    assert check_settings(Outer, {"inner": {"value": 1}}, Check()).missing == []


# -- one home for a default ---------------------------------------------------------------------


def records_of(cls: type) -> Iterator[type]:
    """``cls`` and every dataclass record it holds, at any depth (found by their types).

    A pydantic model is left out: it is the settings model, where defaults belong.
    """
    if issubclass(cls, BaseModel):
        return
    yield cls
    for _, hint in _fields(cls):
        record, _ = _record_in(hint)
        if record is not None:
            yield from records_of(record)


def defaults_of(cls: type) -> list[str]:
    """The fields of ``cls`` and of the records it holds that have a default of their own."""
    return [
        f"{record.__name__}.{f.name}"
        for record in records_of(cls)
        for f in dataclasses.fields(record)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]


def test_no_default_is_written_beside_the_settings_model() -> None:
    """Proves a default has one home, the settings model (vmpool/config/settings.py): no
    field of the resolved Config, nor of a record it holds (pools, providers, auth, LDAP,
    the Redis connection), has a default of its own. A second one there is a copy that
    drifts, and silently fills a field its maker forgot to give."""
    names = {record.__name__ for record in records_of(Config)}
    assert {"Config", "PoolConfig", "ProviderConfig", "AuthConfig", "LdapConfig"} <= names
    assert {"RedisOptions", "DurabilitySetting"} <= names
    assert defaults_of(Config) == []


@dataclasses.dataclass(frozen=True)
class WithDefaults:
    plain: int
    inner: Inner
    given: int = 4
    made: tuple[str, ...] = dataclasses.field(default_factory=tuple)


def test_the_default_check_finds_a_default() -> None:
    assert defaults_of(WithDefaults) == ["WithDefaults.given", "WithDefaults.made"]
