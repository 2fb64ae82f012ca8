"""vmpool.config: vmpooler's YAML format, units, environment overrides, validation."""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from vmpool.config import (
    DEMO_CONFIG_YAML,
    DEMO_SOURCE,
    Config,
    ConfigError,
    Schedule,
    demo_config,
    json_schema,
    load_config,
    mask_url_password,
    parse_config,
    public_form,
    validate_redis_url,
)
from vmpool.config.settings import AuthSection, ConfigSection, PoolSection, RedisSection
from vmpool.providers import PermanentProviderError, SimulatedOptions

HASH = "sha256$salt$" + "ab" * 32
PBKDF2 = "pbkdf2_sha256$260000$salt$" + "cd" * 32


def write(tmp_path: Path, text: str, name: str = "vmpool.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    return load_config(write(tmp_path, text), env=env or {})


def error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message


# -- format ---------------------------------------------------------------------------

COLON = """\
:config:
  ondemand_request_ttl: 2
  prefix: poolvm-
:providers:
  :simulated:
    boot_seconds: 1
:pools:
  - :name: p1
    :alias: [a1]
    :size: 2
"""

PLAIN = """\
config:
  ondemand_request_ttl: 2
  prefix: poolvm-
providers:
  simulated:
    boot_seconds: 1
pools:
  - name: p1
    alias: [a1]
    size: 2
"""


def test_leading_colon_and_plain_keys_mean_the_same(tmp_path: Path) -> None:
    with_colons = load(tmp_path, COLON)
    plain = load_config(write(tmp_path, PLAIN, "plain.yaml"), env={})
    assert public_form(with_colons) | {"source": ""} == public_form(plain) | {"source": ""}
    assert with_colons.pool("p1").alias == ("a1",)
    assert with_colons.pool("p1").size == 2
    assert with_colons.ondemand_request_ttl_s == 120
    assert with_colons.hostname_prefix == "poolvm-"
    assert with_colons.providers["simulated"].options == {"boot_seconds": 1}
    assert with_colons.warnings == ()


def test_same_key_with_and_without_colon_is_an_error(tmp_path: Path) -> None:
    message = error(tmp_path, ":config: {}\nconfig: {}\n")
    assert ": config: given twice" in message


def test_pool_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, "pools:\n  - name: p1\n")
    pool = config.pool("p1")
    assert pool.alias == ()
    assert pool.template == "p1"
    assert pool.size == 0
    assert pool.timeout_s == 15 * 60
    assert pool.provider == "simulated"
    assert pool.ready_ttl_s is None
    assert pool.domain is None
    assert pool.clone_target is None
    assert set(config.providers) == {"simulated"}
    assert config.providers["simulated"].provider_class == "simulated"
    assert dict(config.providers["simulated"].options) == {}


def test_global_defaults_and_empty_file(tmp_path: Path) -> None:
    config = load(tmp_path, "")
    assert config.pools == {}
    assert config.providers == {}
    assert config.ondemand_request_ttl_s == 300
    assert config.ondemand_request_grace_s == 0
    assert config.max_ondemand_instances_per_request == 10
    assert config.ondemand_clone_limit == 10
    assert config.max_vm_retries == 3
    assert config.vm_lifetime_s == 12 * 3600
    assert config.vm_lifetime_auth_s == 12 * 3600
    assert config.timeout_s == 15 * 60
    assert config.data_ttl_s == 168 * 3600
    assert config.hostname_prefix == ""
    assert config.key_prefix == "vmpool"
    assert config.backend_weight == {}
    assert config.redis_url is None
    assert config.lock_expire_s == 60
    assert config.reconcile_grace_s == 120
    assert config.schedule == Schedule()
    assert config.auth is None
    assert any("no pools configured" in w for w in config.warnings)


def test_aliases_string_or_list(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        pools:
          - name: p1
            alias: one
          - name: p2
            alias: [two, deux, two, p2]
          - name: p3
            alias: []
        """,
    )
    assert config.pool("p1").alias == ("one",)
    assert config.pool("p2").alias == ("two", "deux")  # duplicates and its own name dropped
    assert config.pool("p3").alias == ()


def test_config_is_immutable(tmp_path: Path) -> None:
    config = load(tmp_path, "pools:\n  - name: p1\n")
    with pytest.raises(TypeError):
        config.pools["x"] = config.pool("p1")  # type: ignore[index]
    with pytest.raises(AttributeError):
        config.timeout_s = 1  # type: ignore[misc]


def test_pool_raises_key_error_for_unknown_and_aliases(tmp_path: Path) -> None:
    config = load(tmp_path, "pools:\n  - {name: p1, alias: a}\n")
    with pytest.raises(KeyError):
        config.pool("nope")
    with pytest.raises(KeyError):
        config.pool("a")


# -- units ----------------------------------------------------------------------------


def test_units(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        :config:
          ondemand_request_ttl: 0.5
          ondemand_request_grace: 7
          vm_lifetime: 2
          vm_lifetime_auth: 24
          timeout: 3
          data_ttl: 1.5
          ready_ttl: 10
          lock_expire: 12
          reconcile_grace: 0
        :pools:
          - name: inherits
          - name: own
            timeout: 0.25
            ready_ttl: 1440
        """,
    )
    assert config.ondemand_request_ttl_s == 30
    assert config.ondemand_request_grace_s == 7
    assert config.vm_lifetime_s == 7200
    assert config.vm_lifetime_auth_s == 24 * 3600
    assert config.timeout_s == 180
    assert config.data_ttl_s == 5400
    assert config.lock_expire_s == 12
    assert config.reconcile_grace_s == 0
    assert config.pool("inherits").timeout_s == 180
    assert config.pool("inherits").ready_ttl_s == 600
    assert config.pool("own").timeout_s == 15
    assert config.pool("own").ready_ttl_s == 1440 * 60
    assert all(isinstance(v, float) for v in (config.lock_expire_s, config.timeout_s))


def test_vm_lifetime_auth_defaults_to_vm_lifetime(tmp_path: Path) -> None:
    config = load(tmp_path, ":config: {vm_lifetime: 3}\n")
    assert config.vm_lifetime_auth_s == 3 * 3600


def test_data_ttl_under_redis_as_vmpooler_has_it(tmp_path: Path) -> None:
    assert load(tmp_path, ":redis: {data_ttl: 2}\n").data_ttl_s == 7200
    # :config: wins over :redis: when both are given
    assert load(tmp_path, ":redis: {data_ttl: 2}\n:config: {data_ttl: 3}\n").data_ttl_s == 10800


def test_schedule_section(tmp_path: Path) -> None:
    config = load(tmp_path, ":schedule: {sweep_expired: 0.5, reap_running: 60}\n")
    assert config.schedule == Schedule(sweep_expired=0.5, reap_running=60)
    assert public_form(config)["schedule"] == {
        "sweep_expired": 0.5,
        "provision_sweep": 5,
        "check_pending_sweep": 0.25,
        "reap_running": 60,
        "destroy_sweep": 5,
        "reconcile": 30,
        "top_up_pools": 5,
        "check_ready": 60,
        "record_history": 20,
    }


def test_schedule_old_key_names_still_load(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        ":schedule: {sweep: 0.5, provision: 1, check_pending: 3, reap: 60, destroy: 4}\n"
        "pools: [{name: p1}]\n",
    )
    assert config.warnings == ()
    assert config.schedule == Schedule(
        sweep_expired=0.5,
        provision_sweep=1,
        check_pending_sweep=3,
        reap_running=60,
        destroy_sweep=4,
    )


def test_schedule_key_given_in_both_spellings_is_an_error(tmp_path: Path) -> None:
    message = error(tmp_path, ":schedule: {sweep: 1, sweep_expired: 2}\n")
    assert message.endswith(
        ": schedule.sweep_expired: given twice (as 'sweep' and 'sweep_expired')"
    )


def test_schedule_error_names_the_key_as_written(tmp_path: Path) -> None:
    message = error(tmp_path, ":schedule: {reap: 0}\n")
    assert (
        ": schedule.reap: must be a number of seconds from 0.1 to 86400 (a day), got 0" in message
    )


def test_backend_weight_and_clone_target(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        :config:
          clone_target: cluster1
          backend_weight: {cluster1: 60, cluster2: 40}
        :pools:
          - {name: p1}
          - {name: p2, clone_target: cluster2}
        """,
    )
    assert config.backend_weight == {"cluster1": 60.0, "cluster2": 40.0}
    assert config.pool("p1").clone_target == "cluster1"
    assert config.pool("p2").clone_target == "cluster2"


# -- environment ----------------------------------------------------------------------


def test_env_overrides(tmp_path: Path) -> None:
    text = """
    :config:
      ondemand_request_ttl: 5
      ondemand_clone_limit: 3
      max_ondemand_instances_per_request: 4
      vm_lifetime: 1
      timeout: 1
      prefix: file-
    :redis: {data_ttl: 1, url: "redis://file:6379/0"}
    :pools:
      - name: p1
      - name: p2
        timeout: 2
    """
    env = {
        "ONDEMAND_REQUEST_TTL": "0.5",
        "ONDEMAND_CLONE_LIMIT": "30",
        "MAX_ONDEMAND_INSTANCES_PER_REQUEST": "40",
        "VM_LIFETIME": "6",
        "VM_LIFETIME_AUTH": "48",
        "TIMEOUT": "10",
        "PREFIX": "env-",
        "REDIS_DATA_TTL": "24",
        "VMPOOL_REDIS_URL": "redis://envhost:6380/3",
    }
    config = load(tmp_path, text, env)
    assert config.ondemand_request_ttl_s == 30
    assert config.ondemand_clone_limit == 30
    assert config.max_ondemand_instances_per_request == 40
    assert config.vm_lifetime_s == 6 * 3600
    assert config.vm_lifetime_auth_s == 48 * 3600
    assert config.timeout_s == 600
    assert config.pool("p1").timeout_s == 600  # inherits the overridden global timeout
    assert config.pool("p2").timeout_s == 120  # its own timeout stays
    assert config.hostname_prefix == "env-"
    assert config.data_ttl_s == 24 * 3600
    assert config.redis_url == "redis://envhost:6380/3"


def test_empty_env_values_are_ignored(tmp_path: Path) -> None:
    config = load(tmp_path, ":config: {timeout: 2}\n", {"TIMEOUT": "", "PREFIX": " "})
    assert config.timeout_s == 120
    assert config.hostname_prefix == ""


def test_env_defaults_to_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONDEMAND_CLONE_LIMIT", "7")
    assert load_config(write(tmp_path, "")).ondemand_clone_limit == 7


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ONDEMAND_REQUEST_TTL", "soon"),
        ("ONDEMAND_REQUEST_TTL", "0"),
        ("ONDEMAND_CLONE_LIMIT", "1.5"),
        ("MAX_ONDEMAND_INSTANCES_PER_REQUEST", "0"),
        ("VM_LIFETIME", "-1"),
        ("VM_LIFETIME_AUTH", "x"),
        ("TIMEOUT", "nan"),
        ("PREFIX", "Bad Prefix"),
        ("REDIS_DATA_TTL", "forever"),
        ("VMPOOL_REDIS_URL", "http://example.com"),
    ],
)
def test_bad_env_value_names_the_variable(tmp_path: Path, name: str, value: str) -> None:
    message = error(tmp_path, "pools: [{name: p1}]\n", {name: value})
    assert f"environment {name}: " in message


def test_vmpool_config_env_selects_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "pools: [{name: from-env}]\n")
    config = load_config(env={"VMPOOL_CONFIG": str(path)})
    assert list(config.pools) == ["from-env"]
    assert config.source == str(path)


# -- warnings -------------------------------------------------------------------------


def test_unknown_keys_warn(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        :bogus_section: {}
        :config:
          ondemand_request_tll: 5
        :schedule:
          sweeep: 1
        :providers:
          :simulated:
            boot_secs: 1
        :pools:
          - name: p1
            sise: 3
        """,
    )
    text = "\n".join(config.warnings)
    for key in (
        "bogus_section",
        "config.ondemand_request_tll",
        "schedule.sweeep",
        "providers.simulated.boot_secs",
        "pools[0].sise",
    ):
        assert f": {key}: unknown" in text, key
    assert all("\n" not in w for w in config.warnings)
    assert len(config.warnings) == 5


def test_vmpooler_keys_we_do_not_use_load(tmp_path: Path) -> None:
    """vmpooler's keys vmpool has no use for load: silently in :config: and the other
    sections, with a warning naming each pool key the pool's provider does not read."""
    config = load(
        tmp_path,
        """
        :statsd: {server: statsd.example.com}
        :graphite: {server: graphite.example.com}
        :prometheus: {prefix: vmpooler}
        :tracing: {enabled: false}
        :tagfilter: {url: '(.*)\\/'}
        :redis: {server: redis, connection_pool_size: 5}
        :config:
          site_name: vmpooler
          logfile: /var/log/vmpooler.log
          task_limit: 10
          vm_checktime: 1
          ready_ttl: 60
          check_loop_delay_min: 5
          check_loop_delay_max: 60
          check_loop_delay_decay: 2.0
          dlq_enabled: true
          purge_enabled: false
          max_pending_age: 3600
          health_check_enabled: true
          rate_limiting_enabled: true
          circuit_breaker_enabled: true
          experimental_features: true
          create_linked_clones: true
        :pools:
          - name: p1
            folder: Pooled VMs/p1
            datastore: vmstorage
            check_loop_delay_min: 5
            create_linked_clone: false
        """,
    )
    unread = ("folder", "datastore", "check_loop_delay_min", "create_linked_clone")
    source = tmp_path / "vmpool.yaml"
    not_here = [  # vmpooler keys that change what it does, which vmpool does not do
        f"{source}: config.rate_limiting_enabled: vmpooler 3.8/3.9's per-address rate limiter"
        " is not vmpool's: vmpool limits each user's POST and DELETE calls with :auth:"
        " rate_limit_per_minute; ignored",
        f"{source}: config.create_linked_clones: no provider here reads it (vsphere does); ignored",
    ]
    assert sorted(config.warnings) == sorted(
        [
            f"{source}: pools[0].{key}: a vmpooler key provider class 'simulated' does not"
            " honour; ignored"
            for key in unread
        ]
        + not_here
    )


def test_global_domain_is_a_warning_and_ignored(tmp_path: Path) -> None:
    config = load(tmp_path, ":config: {domain: example.com}\npools: [{name: p1}]\n")
    assert config.pool("p1").domain is None
    assert any("config.domain" in w and "dns_plugin" in w for w in config.warnings)


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("- a\n- b\n", "top level", "must be a mapping"),
        (":config: [1]\n", "config", "must be a mapping"),
        (":pools: {name: p1}\n", "pools", "must be a list"),
        (":pools: [p1]\n", "pools[0]", "must be a mapping"),
        (":pools: [{size: 1}]\n", "pools[0].name", "missing"),
        (":pools: [{name: 'a b'}]\n", "pools[0].name", "letters, digits"),
        (":pools: [{name: '-x'}]\n", "pools[0].name", "letters, digits"),
        (":pools: [{name: p1}, {name: p2}, {name: p1}]\n", "pools[2].name", "duplicate"),
        (
            ":pools: [{name: p1}, {name: p2, size: abc}]\n",
            "pools[1].size",
            "a non-negative integer (0 to 10000)",
        ),
        (
            ":pools: [{name: p1, size: -1}]\n",
            "pools[0].size",
            "a non-negative integer (0 to 10000)",
        ),
        (
            ":pools: [{name: p1, size: 1.5}]\n",
            "pools[0].size",
            "a non-negative integer (0 to 10000)",
        ),
        (
            ":pools: [{name: p1, size: true}]\n",
            "pools[0].size",
            "a non-negative integer (0 to 10000)",
        ),
        (
            ":pools: [{name: p1, timeout: 0}]\n",
            "pools[0].timeout",
            "minutes from 1/600 (0.1 second)",
        ),
        (
            ":pools: [{name: p1, timeout: -3}]\n",
            "pools[0].timeout",
            "minutes from 1/600 (0.1 second)",
        ),
        (
            ":pools: [{name: p1, ready_ttl: 0}]\n",
            "pools[0].ready_ttl",
            "minutes from 1/600 (0.1 second)",
        ),
        (":pools: [{name: p1, alias: {a: 1}}]\n", "pools[0].alias", "list of names"),
        (":pools: [{name: p1, alias: [ok, 'no way']}]\n", "pools[0].alias[1]", "letters"),
        (":pools: [{name: p1, template: [x]}]\n", "pools[0].template", "must be a string"),
        (":pools: [{name: p1, domain: 'not a domain'}]\n", "pools[0].domain", "DNS domain"),
        (":pools: [{name: p1, dns_plugin: nope}]\n", "pools[0].dns_plugin", "unknown dns"),
        (":pools: [{name: p1, provider: dummy}]\n", "pools[0].provider", "only `simulated`"),
        (
            ":providers: {vsphere: {server: v}}\n:pools: [{name: p1, provider: vsphere}]\n",
            "pools[0].folder",
            "missing",
        ),
        (
            ":providers: {vsphere: {server: v}}\n"
            ":pools: [{name: p1, provider: vsphere, folder: /abs}]\n",
            "pools[0].folder",
            "inventory path",
        ),
        (
            ":providers: {x: {provider_class: dummy}}\n:pools: [{name: p1, provider: x}]\n",
            "pools[0].provider",
            "only `simulated`, `ec2`, `gce`, `openstack` and `vsphere` are implemented",
        ),
        (":providers: {simulated: {boot_seconds: fast}}\n", "boot_seconds", "number or [min"),
        (":providers: {simulated: {boot_seconds: -1}}\n", "boot_seconds", "from 0 to 86400"),
        (":providers: {simulated: {boot_seconds: 1.0e+300}}\n", "boot_seconds", "(a day)"),
        (
            ":providers: {simulated: {create_latency_seconds: 1.0e+300}}\n",
            "create_latency_seconds",
            "from 0 to 86400",
        ),
        (":providers: {simulated: {boot_seconds: [5, 2]}}\n", "boot_seconds", "min <= max"),
        (":providers: {simulated: {boot_seconds: [1, 2, 3]}}\n", "boot_seconds", "[min, max]"),
        (":providers: {simulated: {boot_seconds: [-1, 2]}}\n", "boot_seconds[0]", "from 0"),
        (":providers: {simulated: {create_fail_percent: 101}}\n", "create_fail", "0 to 100"),
        (":providers: {simulated: {ready_fail_percent: -1}}\n", "ready_fail", "0 to 100"),
        (":providers: {simulated: {destroy_fail_percent: '5'}}\n", "destroy_fail", "0 to 100"),
        (":providers: {simulated: {seed: 1.5}}\n", "providers.simulated.seed", "integer"),
        (":providers: {simulated: {seed: abc}}\n", "providers.simulated.seed", "integer"),
        (":providers: {simulated: [1]}\n", "providers.simulated", "must be a mapping"),
        (":providers: {'bad name': {}}\n", "providers.bad name", "provider names"),
        (
            ":config: {ondemand_request_ttl: 0}\n",
            "config.ondemand_request_ttl",
            "minutes from 1/600 (0.1 second)",
        ),
        (
            ":config: {ondemand_request_ttl: -1}\n",
            "config.ondemand_request_ttl",
            "to 525600 (a year)",
        ),
        (":config: {ondemand_request_ttl: soon}\n", "config.ondemand_request_ttl", "got 'soon'"),
        (
            ":config: {ondemand_request_grace: -1}\n",
            "config.ondemand_request_grace",
            "seconds from 0 to 86400",
        ),
        (
            ":config: {max_ondemand_instances_per_request: 0}\n",
            "max_ondemand",
            "an integer from 1 to 10000",
        ),
        (
            ":config: {ondemand_clone_limit: x}\n",
            "config.ondemand_clone_limit",
            "an integer from 1 to 1000000",
        ),
        (":config: {max_vm_retries: -1}\n", "config.max_vm_retries", "an integer from 0 to 100"),
        (":config: {vm_lifetime: 0}\n", "config.vm_lifetime", "hours from 1/36000 (0.1 second)"),
        (
            ":config: {vm_lifetime_auth: []}\n",
            "config.vm_lifetime_auth",
            "hours from 1/36000 (0.1 second)",
        ),
        (":config: {timeout: .nan}\n", "config.timeout", "minutes from 1/600 (0.1 second)"),
        (":config: {data_ttl: 0}\n", "config.data_ttl", "hours from 1/60 (1 minute) to 8760"),
        (":redis: {data_ttl: -2}\n", "redis.data_ttl", "hours from 1/60 (1 minute)"),
        (":config: {prefix: Bad_Prefix}\n", "config.prefix", "lowercase"),
        (":config: {backend_weight: [1]}\n", "config.backend_weight", "must be a mapping"),
        (":config: {backend_weight: {a: -1}}\n", "config.backend_weight.a", "from 0 to 1000000"),
        (":config: {lock_expire: 0}\n", "config.lock_expire", "seconds from 1 to 86400"),
        (":config: {reconcile_grace: -5}\n", "config.reconcile_grace", "seconds from 0 to 86400"),
        (":config: {ready_ttl: 0}\n", "config.ready_ttl", "minutes from 1/600 (0.1 second)"),
        (":schedule: {sweep_expired: 0}\n", "schedule.sweep_expired", "seconds from 0.1 to 86400"),
        (":schedule: [1]\n", "schedule", "must be a mapping"),
        (":redis: {url: 'http://x'}\n", "redis.url", "redis://"),
        (":redis: {url: 'redis://:pw@'}\n", "redis.url", "no host"),
        (":redis: {port: 70000}\n", "redis.port", "1-65535"),
        (":redis: {port: http}\n", "redis.port", "positive integer"),
        (":redis: {db: -1}\n", "redis.db", "non-negative integer"),
        (":redis: {key_prefix: 'a b'}\n", "redis.key_prefix", "letters"),
        (":redis: {key_prefix: '{x}'}\n", "redis.key_prefix", "letters"),
        (":auth: {provider: ldap}\n", "auth.ldap", "needs an :ldap: section"),
        (":auth: {provider: kerberos}\n", "auth.provider", "not implemented"),
        (":auth: {users: {alice: hunter2}}\n", "auth.users.alice", "not a plain password"),
        (":auth: {users: {alice: 'sha256$s$abc'}}\n", "auth.users.alice", "password hash"),
        (":auth: {users: [alice]}\n", "auth.users", "must be a mapping"),
        (":auth: {rate_limit_per_minute: 0}\n", "auth.rate_limit_per_minute", "positive"),
        (":dns_configs: {ex: {domain: 'bad domain'}}\n", "dns_configs.ex.domain", "DNS"),
    ],
)
def test_validation_errors_name_file_and_key(
    tmp_path: Path, text: str, key: str, problem: str
) -> None:
    message = error(tmp_path, text)
    assert key in message
    assert problem in message


def test_error_format_matches_the_contract(tmp_path: Path) -> None:
    path = write(tmp_path, ":pools:\n  - name: p0\n  - name: p1\n    size: abc\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == (
        f"{path}: pools[1].size: must be a non-negative integer (0 to 10000), got 'abc'"
    )
    assert info.value.source == str(path)
    assert info.value.key == "pools[1].size"


def test_config_error_pickles() -> None:
    err = ConfigError("/x.yaml", "pools[0].name", "missing")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) == "/x.yaml: pools[0].name: missing"


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    message = error(tmp_path, ":config:\n  timeout: 5\n :pools: [\n")
    assert "line 3" in message
    assert "invalid YAML" in message


def test_yaml_unclosed_flow_names_a_line(tmp_path: Path) -> None:
    message = error(tmp_path, "pools: [{name: p1}\nconfig: {}\n")
    assert "line " in message
    assert "invalid YAML" in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == f"{path}: no such file"


def test_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, env={})
    assert str(info.value).startswith(f"{tmp_path}: ")


def test_parse_config_from_data() -> None:
    config = parse_config({":pools": [{":name": "p1"}]}, source="inline", env={})
    assert list(config.pools) == ["p1"]
    assert config.source == "inline"
    with pytest.raises(ConfigError) as info:
        parse_config({"pools": [{"name": "p1", "size": "x"}]}, source="inline", env={})
    assert str(info.value).startswith("inline: pools[0].size: ")


# -- providers ------------------------------------------------------------------------


def test_provider_instances(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        :providers:
          :simulated:
            boot_seconds: [1, 2]
          :flaky:
            provider_class: simulated
            create_fail_percent: 50
            ready_fail_percent: 0
            destroy_fail_percent: 12.5
            seed: 3
          :proxmox:
            server: proxmox.example.com
            password: secret
        :pools:
          - {name: p1}
          - {name: p2, provider: flaky}
          - name: p3
            provider: :flaky
        """,
    )
    assert list(config.providers) == ["simulated", "flaky"]
    flaky = config.providers["flaky"]
    assert flaky.name == "flaky"
    assert flaky.provider_class == "simulated"
    assert dict(flaky.options) == {
        "create_fail_percent": 50,
        "ready_fail_percent": 0,
        "destroy_fail_percent": 12.5,
        "seed": 3,
    }
    assert config.pool("p2").provider == "flaky"
    assert config.pool("p3").provider == "flaky"
    assert any("providers.proxmox" in w and "not implemented" in w for w in config.warnings)


def test_a_pool_naming_simulated_gets_a_default_instance(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        ":providers: {other: {provider_class: simulated}}\n"
        ":pools: [{name: p1, provider: simulated}]\n",
    )
    assert set(config.providers) == {"other", "simulated"}
    assert config.providers["simulated"].options == {}


def test_provider_options_are_checked_by_the_provider_class_model(tmp_path: Path) -> None:
    # One model, found through the provider registry, checks the file and the provider.
    problem = "boot_seconds[1]: must be a number of seconds from 0 to 86400 (a day), got -2"
    with pytest.raises(PermanentProviderError) as info:
        SimulatedOptions.parse({"boot_seconds": [1, -2]})
    assert str(info.value).endswith(f"simulated provider: {problem}")
    message = error(
        tmp_path, ":providers: {flaky: {provider_class: simulated, boot_seconds: [1, -2]}}\n"
    )
    assert message.endswith(f": providers.flaky.{problem}")


# -- names ----------------------------------------------------------------------------


def test_resolve_name(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        :pools:
          - {name: debian-12, alias: [debian]}
          - {name: debian-11, alias: [debian, old]}
          - {name: centos, alias: debian-12}
        """,
    )
    assert config.resolve_name("debian-11") == ["debian-11"]
    assert config.resolve_name("debian") == ["debian-12", "debian-11"]
    assert config.resolve_name("old") == ["debian-11"]
    # an alias equal to another pool's name is allowed: the pool itself comes first
    assert config.resolve_name("debian-12") == ["debian-12", "centos"]
    assert config.resolve_name("nope") == []


def test_dns_plugin_domain(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        :dns_configs:
          :example:
            dns_class: dynamic-dns
            domain: Example.COM.
          :nodomain:
            dns_class: dynamic-dns
        :pools:
          - {name: p1, dns_plugin: example}
          - {name: p2, dns_plugin: example, domain: own.example.org}
          - {name: p3, dns_plugin: nodomain}
          - {name: p4, domain: plain.example.net}
        """,
    )
    assert config.pool("p1").domain == "example.com"
    assert config.pool("p2").domain == "own.example.org"
    assert config.pool("p3").domain is None
    assert config.pool("p4").domain == "plain.example.net"
    assert config.warnings == ()


# -- redis and auth -------------------------------------------------------------------


def test_redis_url_from_parts(tmp_path: Path) -> None:
    config = load(
        tmp_path, ":redis: {server: r.example.com, port: 6380, password: 'p@ss/w', db: 2}\n"
    )
    assert config.redis_url == "redis://:p%40ss%2Fw@r.example.com:6380/2"
    assert load(tmp_path, ":redis: {server: r}\n").redis_url == "redis://r:6379/0"
    assert load(tmp_path, ":redis: {port: 7000}\n").redis_url == "redis://localhost:7000/0"
    assert load(tmp_path, ":redis: {key_prefix: vp}\n").redis_url is None


def test_redis_url_wins_over_parts(tmp_path: Path) -> None:
    config = load(tmp_path, ":redis: {url: 'rediss://:pw@h:6390/1', server: other}\n")
    assert config.redis_url == "rediss://:pw@h:6390/1"
    assert any("redis.url" in w and "server" in w for w in config.warnings)


def test_key_prefix(tmp_path: Path) -> None:
    assert load(tmp_path, ":redis: {key_prefix: 'vmpool-test:1'}\n").key_prefix == "vmpool-test:1"


def test_mask_and_validate_redis_url() -> None:
    assert mask_url_password("redis://:secret@h:1/0") == "redis://:***@h:1/0"
    assert mask_url_password("redis://user:secret@h:1/0") == "redis://user:***@h:1/0"
    assert mask_url_password("redis://h:1/0") == "redis://h:1/0"
    assert validate_redis_url(" unix:///tmp/redis.sock ") == "unix:///tmp/redis.sock"
    with pytest.raises(ValueError) as info:
        validate_redis_url("http://:secret@h")
    assert "secret" not in str(info.value)


def test_auth(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        f"""
        :auth:
          provider: static
          users:
            alice: '{HASH}'
            bob: '{PBKDF2}'
          rate_limit_per_minute: 120
        """,
    )
    assert config.auth is not None
    assert config.auth.provider == "static"
    assert dict(config.auth.users) == {"alice": HASH, "bob": PBKDF2}
    assert config.auth.rate_limit_per_minute == 120
    public = public_form(config)
    assert public["auth"]["users"] == ["alice", "bob"]
    assert HASH not in str(public)


def test_dummy_auth_warns(tmp_path: Path) -> None:
    config = load(tmp_path, ":auth: {provider: dummy}\n")
    assert config.auth is not None
    assert config.auth.provider == "dummy"
    assert config.auth.users == {}
    assert config.auth.rate_limit_per_minute is None
    assert any("dummy" in w for w in config.warnings)


def test_public_dict_masks_secrets(tmp_path: Path) -> None:
    config = load(tmp_path, ":redis: {url: 'redis://:topsecret@h:1/0'}\n")
    assert config.redis_url == "redis://:topsecret@h:1/0"
    assert "topsecret" not in str(public_form(config))


# -- demo -----------------------------------------------------------------------------


def test_demo_config() -> None:
    config = demo_config()
    assert config.source == DEMO_SOURCE
    assert config.warnings == ()
    assert list(config.pools) == ["debian-12-x86_64", "centos-9-x86_64", "flaky-x86_64"]
    assert config.pool("debian-12-x86_64").alias == ("debian", "debian-12")
    assert config.pool("centos-9-x86_64").alias == ("centos",)
    assert config.resolve_name("debian") == ["debian-12-x86_64"]
    assert all(pool.domain == "example.com" for pool in config.pools.values())
    assert config.pool("flaky-x86_64").provider == "flakycloud"
    simulated = config.providers["simulated"]
    assert simulated.provider_class == "simulated"
    assert simulated.options["boot_seconds"] == [2, 5]
    assert simulated.options["seed"] == 1
    flaky = config.providers["flakycloud"]
    assert flaky.provider_class == "simulated"
    assert flaky.options["create_fail_percent"] == 60
    assert flaky.options["ready_fail_percent"] == 30
    assert flaky.options["seed"] == 7
    assert config.ondemand_request_ttl_s == 60
    assert config.timeout_s == 30
    assert config.data_ttl_s == 3600
    assert config.max_ondemand_instances_per_request == 10
    assert config.ondemand_clone_limit == 20
    assert config.reconcile_grace_s == 30
    assert config.schedule == Schedule(
        sweep_expired=2,
        provision_sweep=1,
        check_pending_sweep=0.25,
        reap_running=5,
        destroy_sweep=1,
        reconcile=10,
    )


def test_demo_yaml_is_vmpooler_format() -> None:
    data = yaml.safe_load(DEMO_CONFIG_YAML)
    assert {":config", ":pools", ":providers"} <= set(data)


def test_load_config_without_path_or_env_is_the_demo() -> None:
    config = load_config(env={})
    assert config.source == DEMO_SOURCE
    assert config == demo_config()


def test_demo_takes_env_overrides() -> None:
    config = load_config(env={"ONDEMAND_REQUEST_TTL": "2"})
    assert config.ondemand_request_ttl_s == 120


# -- schema ---------------------------------------------------------------------------


def test_json_schema() -> None:
    schema = json_schema()
    json.dumps(schema)  # plain data
    assert schema["title"] == "vmpool configuration"
    assert set(schema["properties"]) == {
        "config",
        "pools",
        "providers",
        "redis",
        "auth",
        "dns_configs",
        "schedule",
        "tagfilter",
        "quotas",
    }
    defs = schema["$defs"]
    ttl = defs["ConfigSection"]["properties"]["ondemand_request_ttl"]
    assert (ttl["default"], ttl["unit"], ttl["minimum"], ttl["maximum"]) == (
        5,
        "minutes",
        0.1 / 60,
        525600,
    )
    assert ttl["description"].endswith("Range: 0.00166667 to 525600 minutes.")
    assert "minutes" in ttl["description"]
    assert defs["ConfigSection"]["properties"]["vm_lifetime"]["unit"] == "hours"
    assert list(defs["Schedule"]["properties"]) == list(Schedule.model_fields)
    assert defs["RedisSection"]["properties"]["port"]["maximum"] == 65535
    entries = schema["properties"]["providers"]["additionalProperties"]["anyOf"]
    simulated = entries[0]["properties"]
    assert simulated["provider_class"]["const"] == "simulated"
    assert simulated["create_fail_percent"]["maximum"] == 100
    assert all("description" in field for field in defs["ConfigSection"]["properties"].values())


SECTION_MODELS = {
    "config": ConfigSection,
    "redis": RedisSection,
    "schedule": Schedule,
    "auth": AuthSection,
}
ODD_VALUES: list[Any] = [{"a": 1}, [[1]], "x y z", -5, True, 1e400, "", [None]]


@pytest.mark.parametrize(
    ("section", "key"),
    [(name, key) for name, model in SECTION_MODELS.items() for key in model.model_fields]
    + [("pools[0]", key) for key in PoolSection.model_fields if key != "name"]
    + [("providers.simulated", key) for key in SimulatedOptions.model_fields],
)
def test_every_setting_fails_in_one_line_of_its_own(tmp_path: Path, section: str, key: str) -> None:
    """No value, however odd, gets pydantic's own text or a traceback: one line naming
    the file and the key (the test reads each section's keys from the settings)."""
    for value in ODD_VALUES:
        if section == "pools[0]":
            data: dict[str, Any] = {"pools": [{"name": "p1", key: value}]}
        elif section.startswith("providers."):
            data = {"providers": {"simulated": {key: value}}}
        else:
            data = {section: {key: value}}
        try:
            parse_config(data, source="f.yaml", env={})
        except ConfigError as exc:
            message = str(exc)
            assert "\n" not in message
            assert message.startswith(f"f.yaml: {section}.{key}"), message
            assert "Input should" not in message and "pydantic" not in message, message
