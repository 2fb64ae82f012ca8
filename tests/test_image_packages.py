"""The locked package sets: requirements/image.lock (the container image, and what the
Dockerfile does with it) and requirements/dev.lock (the development and CI venv).

No image can be built here (no Docker daemon), so the package set is checked where it
is written down: the lock pins every distribution the Dockerfile installs (with
``--require-hashes``, then vmpool itself with ``--no-index``, so the build fails on a
missing one). These tests prove that the lock

- satisfies pyproject.toml: vmpool's requirements and those of every extra the
  Dockerfile names (``cloud``, ``vsphere``, ``dashboard``), each pinned with hashes;
- **imports every registered provider** (``PROVIDER_CLASSES``, so a provider added to
  the registry is covered the day it lands): in a child interpreter where only the
  lock's distributions (and the standard library) can be imported, each provider's
  module and every module its code imports, lazily inside functions included (read
  from its source), import. An optional import (``try: import x except ImportError``)
  that the image would miss while this test venv has it fails too: the image would
  behave differently from what the tests ran (libcloud's GCE service-account auth
  quietly needs ``cryptography``). Each distribution used is at the locked version here.

and that the development lock

- satisfies pyproject.toml with every extra (``make venv`` installs nothing else), pins
  the installer and the build backend, and is what ``make venv`` installs, with hashes;
- pins every distribution the image's lock pins, at the same version: the image ships
  what the tests ran.

Every check reads the lock files and pyproject.toml, never the package index: a release
published today changes nothing here until ``make lock`` is run and committed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "image.lock"
DEV_LOCK = ROOT / "requirements" / "dev.lock"
MAKEFILE = ROOT / "Makefile"
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_PYTHON = "3.11"  # the Dockerfile's PYTHON_IMAGE
REQUIRED_EXTRAS = {"cloud", "vsphere", "dashboard"}
PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def locked(lock: Path = LOCK) -> dict[str, tuple[str, list[str]]]:
    """Canonical name -> (version, its sha256 hashes) of every pin of a lock."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in lock.read_text().splitlines():
        match = PIN_RE.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            pins[current] = (match.group(2), [])
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            pins[current][1].append(digest)
    return pins


def dockerfile_extras() -> set[str]:
    match = re.search(r"^ARG VMPOOL_EXTRAS=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert match, "the Dockerfile names the extras it installs (ARG VMPOOL_EXTRAS=...)"
    return set(match.group(1).split(","))


def test_the_dockerfile_installs_the_lock_with_hashes_and_every_extra() -> None:
    text = DOCKERFILE.read_text()
    assert dockerfile_extras() >= REQUIRED_EXTRAS
    assert "--require-hashes --no-deps -r requirements/image.lock" in text
    assert re.search(r'--no-index --find-links=\S+ "vmpool\[\$\{VMPOOL_EXTRAS\}\]"', text)
    assert "pip check" in text
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "!requirements/image.lock" in ignore, ".dockerignore lets the lock in"


@pytest.mark.parametrize("lock", [LOCK, DEV_LOCK], ids=lambda p: p.name)
def test_every_pin_has_hashes(lock: Path) -> None:
    pins = locked(lock)
    assert pins
    unhashed = sorted(name for name, (_, hashes) in pins.items() if not hashes)
    assert not unhashed, f"pins without --hash: {unhashed}"
    text = lock.read_text()
    assert "--index-url" not in text and "--find-links" not in text, "no machine's index"
    assert not re.search(r"^-e |^file:|@ file:", text, re.M), "no local path in a lock"


def test_the_lock_satisfies_pyproject() -> None:
    """vmpool's requirements and those of the image's extras, as pip would evaluate
    them on the image's Python (Linux), are each pinned at a version they allow. An
    extra the Dockerfile names and pyproject.toml does not declare yet is reported, not
    failed (pip only warns for it; it is pending)."""
    problems = unsatisfied(LOCK, dockerfile_extras())
    assert not problems, "run `make lock`:\n" + "\n".join(problems)


def test_the_dev_lock_satisfies_pyproject_with_every_extra() -> None:
    """``make venv`` installs the dev lock and nothing else: it must hold every extra's
    requirements (the tests', the embedded Redis', the clouds'), and the installer and
    build backend it runs with."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    problems = unsatisfied(DEV_LOCK, set(project["project"]["optional-dependencies"]))
    pins = locked(DEV_LOCK)
    for text in project["build-system"]["requires"]:
        requirement = Requirement(text)
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is None or not requirement.specifier.contains(pin[0]):
            problems.append(f"build-system: {text}: the lock has {pin and pin[0]}")
    if "pip" not in pins:
        problems.append("pip: not in the lock (requirements/tools.in)")
    assert not problems, "run `make lock`:\n" + "\n".join(problems)


def test_the_image_ships_the_versions_the_tests_ran() -> None:
    """Every distribution of the image's lock is pinned in the dev lock at the same
    version (``make lock`` compiles the image's lock with the dev lock as constraints)."""
    dev = locked(DEV_LOCK)
    differs = sorted(
        f"{name}: image {version}, dev {dev[name][0] if name in dev else 'missing'}"
        for name, (version, _) in locked(LOCK).items()
        if name not in dev or dev[name][0] != version
    )
    assert not differs, "run `make lock`:\n" + "\n".join(differs)


def test_make_venv_installs_the_dev_lock_with_hashes() -> None:
    """The venv's recipe installs from the lock with hashes and resolves nothing itself:
    vmpool goes in with ``--no-deps`` and no build isolation (which would fetch the
    build backend from the index)."""
    text = MAKEFILE.read_text()
    recipe = text[text.index("$(VENV)/.installed:") :].split("\n\n", 1)[0]
    assert "requirements/dev.lock" in recipe.splitlines()[0], "the venv depends on the lock"
    assert "pip install -q --require-hashes --no-deps -r requirements/dev.lock" in recipe
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert all("--no-deps" in line for line in installs), installs
    assert "--no-build-isolation -e ." in recipe
    assert "pip check" in recipe


def unsatisfied(lock: Path, extras: set[str]) -> list[str]:
    """What of vmpool's requirements and those of ``extras``, as pip would evaluate them
    on the image's Python (Linux), a lock does not pin at a version they allow."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared: dict[str, list[str]] = project["optional-dependencies"]
    pins = locked(lock)
    env = {**default_environment(), "python_version": IMAGE_PYTHON, "sys_platform": "linux"}
    problems: list[str] = []
    wanted: list[tuple[str, str]] = [("(base)", r) for r in project["dependencies"]]
    for extra in sorted(extras):
        if extra not in declared:
            warnings.warn(f"the image's extra {extra!r} is not declared yet", stacklevel=1)
            continue
        wanted += [(extra, r) for r in declared[extra]]
    for where, text in wanted:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate({**env, "extra": ""}):
            continue
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is None:
            problems.append(f"{where}: {text}: not in the lock")
        elif not requirement.specifier.contains(pin[0], prereleases=True):
            problems.append(f"{where}: {text}: the lock has {pin[0]}")
        for sub in sorted(requirement.extras):  # redis[hiredis]: the extra's own needs
            for dep in importlib.metadata.requires(requirement.name) or []:
                dep_req = Requirement(dep)
                wanted_here = dep_req.marker and dep_req.marker.evaluate({**env, "extra": sub})
                if wanted_here and canonicalize_name(dep_req.name) not in pins:
                    problems.append(f"{where}: {text}: {dep_req.name} not in the lock")
    return problems


# -- the providers, imported with nothing but the lock ------------------------------------------


def provider_modules() -> dict[str, list[str]]:
    """Provider class name -> the modules to import for it: the modules of its build
    function and options, and every module their source imports (in functions too),
    following vmpool.providers' own modules."""
    from vmpool.providers.registry import PROVIDER_CLASSES

    out: dict[str, list[str]] = {}
    for name, implementation in PROVIDER_CLASSES.items():
        roots = {implementation.build.__module__, implementation.options.__module__}
        out[name] = sorted(_imports_of(roots))
    return out


def _imports_of(roots: set[str]) -> set[str]:
    seen: set[str] = set()
    found: set[str] = set(roots)
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        package = module if spec.submodule_search_locations else module.rpartition(".")[0]
        tree = ast.parse(Path(spec.origin).read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    prefix = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{prefix}.{base}" if base else prefix
                names = [base]
            for imported in names:
                if imported.startswith("vmpool.providers"):
                    todo.append(imported)
                found.add(imported)
    return found


CHILD = textwrap.dedent(
    """
    import importlib, importlib.abc, json, sys

    allowed, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    refused = set()

    class OnlyTheLock(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in allowed or top in sys.stdlib_module_names or top in sys.builtin_module_names:
                return None
            if top.startswith("_sysconfigdata"):  # the stdlib's, named after the platform
                return None
            refused.add(top)
            raise ModuleNotFoundError(f"No module named {name!r} (not in the lock)", name=name)

    sys.meta_path.insert(0, OnlyTheLock())
    failures = {}
    for provider, names in modules.items():
        for name in names:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                failures.setdefault(provider, []).append(f"{name}: {exc}")
    tops = sorted({m.partition(".")[0] for m in list(sys.modules)})
    print(json.dumps({"failures": failures, "refused": sorted(refused), "loaded": tops}))
    """
)


def _run_child(allowed: set[str], modules: dict[str, list[str]]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(sorted(allowed)), json.dumps(modules)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_the_locked_package_set_imports_every_registered_provider() -> None:
    pins = locked()
    top_dists = importlib.metadata.packages_distributions()
    allowed = {"vmpool", "workers"} | {
        top for top, dists in top_dists.items() if any(canonicalize_name(d) in pins for d in dists)
    }
    modules = provider_modules()
    assert {"simulated", "ec2", "gce", "openstack"} <= set(modules)
    assert any(m.startswith("libcloud.") for m in modules["ec2"]), modules["ec2"]
    report = _run_child(allowed, modules)
    assert not report["failures"], f"providers the image cannot import: {report['failures']}"
    # An import the image refuses and this venv allows (an optional dependency) makes
    # the image behave differently from what the tests ran.
    differs = sorted(top for top in report["refused"] if top in top_dists)
    assert not differs, (
        f"the providers try to import {differs}: installed here, missing from the image's lock"
    )
    # What was loaded is at the locked version here (this venv comes from the dev lock,
    # which pins the image's versions): a venv made some other way is named, not trusted.
    for top in report["loaded"]:
        for dist in top_dists.get(top, []):
            name = canonicalize_name(dist)
            if name in pins:
                here = importlib.metadata.version(dist)
                assert here == pins[name][0], (
                    f"{dist} {here} here, {pins[name][0]} in the lock: run `make venv`"
                )


@pytest.mark.slow
def test_the_child_refuses_what_the_lock_lacks() -> None:
    """The check can fail: with libcloud's distribution left out, every cloud provider
    is reported and the simulated one is not."""
    pins = locked()
    top_dists = importlib.metadata.packages_distributions()
    allowed = {"vmpool", "workers"} | {
        top
        for top, dists in top_dists.items()
        if any(
            canonicalize_name(d) in pins and canonicalize_name(d) != "apache-libcloud"
            for d in dists
        )
    }
    report = _run_child(allowed, provider_modules())
    assert {"ec2", "gce", "openstack"} <= set(report["failures"])
    assert "simulated" not in report["failures"]
