"""vmpooler's config sources: `:config: extra_config`, EXTRA_CONFIG, VMPOOLER_CONFIG and
VMPOOLER_CONFIG_FILE, merged as vmpooler 3.9.1 merges them (lib/vmpooler.rb `config`
with the deep_merge gem's `deep_merge`: the main file keeps what it has, lists grow, an
extra file only adds). Before these, every one of them was ignored without a word and
the pools of an extra file vanished."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import ConfigError, load_config

from clihelp import run
from lifecyclehelp import make_fleet, run_dispatched

# vmpooler's spec fixtures (spec/fixtures/vmpooler2.yaml, extra_config1.yaml,
# extra_config2.yaml), with the simulated provider in place of the dummy one.
MAIN = """\
:providers:
  :simulated:
:config:
  task_limit: 10
  vm_lifetime: 12
  prefix: 'poolvm-'
:pools:
  - name: 'pool03'
    size: 5
    provider: simulated
  - name: 'pool04'
    size: 5
    provider: simulated
"""
EXTRA1 = """\
:providers:
  :alice:
    provider_class: simulated
    seed: 3
"""
EXTRA2 = """\
:providers:
  :bob:
    provider_class: simulated
    seed: 4
:pools:
  - name: 'pool05'
    size: 5
    provider: simulated
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def test_two_extra_files_add_their_providers_and_pools_as_vmpoolers_spec_says(
    tmp_path: Path,
) -> None:
    """vmpooler's own spec ('merges two extra file, results in three providers and an
    extra pool'): EXTRA_CONFIG names both, comma-separated."""
    main = write(tmp_path, "vmpooler.yaml", MAIN)
    extras = [write(tmp_path, n, t) for n, t in (("e1.yaml", EXTRA1), ("e2.yaml", EXTRA2))]
    config = load_config(main, env={"EXTRA_CONFIG": ",".join(map(str, extras))})
    assert set(config.providers) == {"simulated", "alice", "bob"}
    assert list(config.pools) == ["pool03", "pool04", "pool05"]
    assert config.hostname_prefix == "poolvm-"  # the merge keeps the main file's keys


def test_config_extra_config_is_read_relative_to_the_file_and_env_replaces_it(
    tmp_path: Path,
) -> None:
    write(tmp_path, "e2.yaml", EXTRA2)
    write(tmp_path, "e1.yaml", EXTRA1)
    main = write(
        tmp_path, "vmpooler.yaml", MAIN.replace(":config:\n", ":config:\n  extra_config: e2.yaml\n")
    )
    assert list(load_config(main, env={}).pools) == ["pool03", "pool04", "pool05"]
    # EXTRA_CONFIG replaces the key, as vmpooler's `parsed_config[:config]['extra_config'] =`
    replaced = load_config(main, env={"EXTRA_CONFIG": str(tmp_path / "e1.yaml")})
    assert list(replaced.pools) == ["pool03", "pool04"] and "alice" in replaced.providers


def test_the_main_file_keeps_its_values_and_a_dropped_one_is_a_warning(tmp_path: Path) -> None:
    """deep_merge without the bang: a value the main file has wins (a warning names the
    one dropped); a false or absent one takes the extra file's; lists are a union."""
    main = write(
        tmp_path,
        "vmpooler.yaml",
        MAIN.replace("  task_limit: 10\n", "  task_limit: 10\n  experimental_features: false\n"),
    )
    extra = write(
        tmp_path,
        "extra.yaml",
        """\
        :config:
          task_limit: 3
          experimental_features: true
          max_vm_retries: 7
          extra_config: elsewhere.yaml
        :pools:
          - name: 'pool03'
            size: 5
            provider: simulated
        """,
    )
    config = load_config(main, env={"EXTRA_CONFIG": str(extra)})
    assert config.task_limit == 10  # the main file's
    assert config.experimental_features is True  # false in the main file: the extra's
    assert config.max_vm_retries == 7  # absent in the main file: the extra's
    assert list(config.pools) == ["pool03", "pool04"]  # an identical pool is one pool
    warnings = "\n".join(config.warnings)
    assert f"{extra}: config.task_limit: 3 ignored: {main}" in warnings
    assert f"{extra}: config.extra_config: not followed" in warnings


def test_an_extra_file_that_cannot_be_read_is_one_line_naming_it(tmp_path: Path) -> None:
    main = write(tmp_path, "vmpooler.yaml", MAIN)
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(main, env={"EXTRA_CONFIG": str(missing)})
    assert str(info.value) == f"{missing}: no such file"
    bad = write(tmp_path, "bad.yaml", "- a list\n")
    with pytest.raises(ConfigError) as info:
        load_config(main, env={"EXTRA_CONFIG": str(bad)})
    assert str(info.value).startswith(f"{bad}: top level: must be a mapping")
    wrong = write(tmp_path, "w.yaml", MAIN.replace(":config:\n", ":config:\n  extra_config: [a]\n"))
    with pytest.raises(ConfigError) as info:
        load_config(wrong, env={})
    assert "config.extra_config: must be file paths separated by commas" in str(info.value)


def test_vmpooler_config_is_the_config_text_and_reads_no_extra_file(tmp_path: Path) -> None:
    """VMPOOLER_CONFIG (YAML text) wins over VMPOOLER_CONFIG_FILE, as in vmpooler, which
    then merges no extra file: both passed over are warnings."""
    other = write(tmp_path, "other.yaml", MAIN.replace("pool04", "pool09"))
    env = {
        "VMPOOLER_CONFIG": MAIN,
        "VMPOOLER_CONFIG_FILE": str(other),
        "EXTRA_CONFIG": str(write(tmp_path, "e2.yaml", EXTRA2)),
    }
    config = load_config(env=env)
    assert config.source == "environment VMPOOLER_CONFIG"
    assert list(config.pools) == ["pool03", "pool04"]
    warnings = "\n".join(config.warnings)
    assert f"environment VMPOOLER_CONFIG_FILE: ignored: the config is {config.source}" in warnings
    assert "environment EXTRA_CONFIG: ignored: config text has no extra files" in warnings


def test_vmpooler_config_file_names_the_file_and_vmpool_config_wins(tmp_path: Path) -> None:
    main = write(tmp_path, "vmpooler.yaml", MAIN)
    other = write(tmp_path, "other.yaml", MAIN.replace("pool04", "pool09"))
    config = load_config(env={"VMPOOLER_CONFIG_FILE": str(main)})
    assert config.source == str(main) and not config.warnings
    both = load_config(env={"VMPOOLER_CONFIG_FILE": str(main), "VMPOOL_CONFIG": str(other)})
    assert list(both.pools) == ["pool03", "pool09"]
    assert f"environment VMPOOLER_CONFIG_FILE: ignored: the config is {other}" in both.warnings


def test_the_cli_takes_vmpooler_config_file_and_says_its_warnings(tmp_path: Path) -> None:
    main = write(tmp_path, "vmpooler.yaml", MAIN)
    extra = write(tmp_path, "e2.yaml", EXTRA2)
    result = run(
        "config", "check", env={"VMPOOLER_CONFIG_FILE": str(main), "EXTRA_CONFIG": str(extra)}
    )
    assert result.exit_code == 0, result.output
    assert f"{main}: 3 pools" in result.output


def test_a_pool_kept_in_an_extra_file_runs(redis_client: redis.Redis, tmp_path: Path) -> None:
    """The acceptance case: a vmpooler config whose pools live in an extra file runs with
    them: the warm pool of the extra file fills to its size."""
    main = write(tmp_path, "vmpooler.yaml", ":providers:\n  simulated: {boot_seconds: 0}\n")
    extra = write(
        tmp_path, "pools.yaml", ":pools:\n  - {name: extrapool, size: 2, provider: simulated}\n"
    )
    config = load_config(main, env={"EXTRA_CONFIG": str(extra)})
    fleet = make_fleet(redis_client, config)
    lifecycle.top_up_pools(fleet)
    run_dispatched(fleet)
    assert len(fleet.store.pool_vms("extrapool", "ready")) == 2
