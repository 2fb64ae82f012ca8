"""deploy/k8s rendered, validated, and tied to the code it runs.

Every overlay (and a few more combinations of the components, so each component is
rendered at least once) goes through ``kubectl kustomize``; every object is validated
with kubernetes-validate in strict mode against each Kubernetes version from 1.30 it
bundles, and the custom resources (KEDA, Prometheus operator) against the minimal
schemas in tests/k8s_schemas/. Then the manifests are held to the code: each vmpool
container's command parses with vmpool's own click CLI, the generated config passes
``vmpool config check``, probe paths are routes of the API app and ports agree, the KEDA
lists are the queues the workers listen on, and every metric the alerts and the Grafana
dashboard name is exported by a live ``/metrics``.

The whole module needs ``kubectl`` (it carries kustomize); without it, it is skipped.
"""

from __future__ import annotations

import base64
import functools
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

from k8shelp import (
    COMBINATIONS,
    K8S,
    SENTINEL_SITE,
    SITE,
    SITE_SECRETS,
    find,
    render,
    render_kustomization,
    render_site,
)

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None,
    reason="kubectl is not on PATH: deploy/k8s cannot be rendered (kubectl kustomize)",
)

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = Path(__file__).resolve().parent / "k8s_schemas"
OPERATIONS_MD = ROOT / "docs" / "operations.md"

OVERLAYS = tuple(sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml")))
# The Secrets the manifests read, by consumer (docs/operations.md, "Secrets"): none is
# rendered by overlays/prod; the operator creates them or generates them in an
# overlay of their own. Optional ones may be absent.
OPERATOR_SECRETS: dict[str, set[str]] = {
    "vmpool-redis-client": {"redis-url"},
    "vmpool-users": {"users.yaml"},
    "vmpool-redis-server": {"password"},
    "vmpool-dashboard": {"username", "password"},
    "vmpool-keda": {"address", "password"},
    "vmpool-cloud": set(),
    "vmpool-cloud-files": set(),
}
OPTIONAL_SECRETS = {"vmpool-cloud", "vmpool-cloud-files"}
TARGETS = (
    tuple(f"overlays/{name}" for name in OVERLAYS) + tuple(COMBINATIONS) + (SITE, SENTINEL_SITE)
)
# The targets whose every Secret is rendered (overlays/prod's are the operator's).
COMPLETE = tuple(t for t in TARGETS if t != "overlays/prod")
PLACEHOLDERS = ("change-me", "replace-me")

# The Kubernetes versions to validate against: every one from 1.30 the package bundles.
MIN_KUBERNETES = (1, 30)
POD_OWNERS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")
VMPOOL_IMAGE = "vmpool"

# Commands the manifests may name before the source has them. Until HEAD's
# source has them (the marker in the file), a manifest may name them before they land;
# once landed they must parse like every other command.
PENDING: dict[tuple[str, str], tuple[str, str]] = {
    ("probe", "worker"): ("vmpool/cli/main.py", '"probe"'),
    ("audit", "--metrics"): ("vmpool/cli/audit.py", '"--metrics"'),
}

ALERTS = {
    "VmpoolExpirySweepLate",
    "VmpoolQueueGrowing",
    "VmpoolAuditViolations",
    "VmpoolOnDemandFailureRatioHigh",
    "VmpoolNoWorkerAlive",
    "VmpoolRedisUnreachable",
    "VmpoolApiNotScraped",
    "VmpoolAuditStale",
    "VmpoolRedisMemoryHigh",
    "VmpoolRedisMemoryFull",
    "VmpoolRedisNotWritable",
    "VmpoolCloneSlotsSaturated",
    "VmpoolWorkersSaturated",
    "VmpoolProviderCircuitOpen",
    "VmpoolFleetMarkLost",
    "VmpoolPoolCreatesFailing",
}

# Metrics the alerts name that another part of the work is adding to /metrics (Redis'
# memory and writability). Until HEAD's vmpool/ source spells the name, it may be
# missing from a scrape; once it does, it must be exported like every other.
PENDING_METRICS = (
    "vmpool_redis_memory_used_bytes",
    "vmpool_redis_memory_max_bytes",
    "vmpool_redis_writable",
)


def named(objs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    hits = [o for o in find(objs, kind) if o["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind} {name}, found {len(hits)}"
    return hits[0]


def generated(objs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    """A generated ConfigMap or Secret by its name before kustomize's hash suffix."""
    hits = [
        o
        for o in find(objs, kind)
        if re.fullmatch(rf"{name}(-[a-z0-9]{{10}})?", o["metadata"]["name"])
    ]
    assert len(hits) == 1, f"expected one generated {kind} {name}, found {len(hits)}"
    return hits[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return dict(obj["spec"]["template"]["spec"])


def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    if obj["kind"] == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"])
    return dict(obj["spec"]["template"]["metadata"]["labels"])


def workloads(objs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in POD_OWNERS]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def all_containers(
    objs: tuple[dict[str, Any], ...],
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for obj in workloads(objs):
        for container in containers(pod_spec(obj)):
            yield obj, container


def component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"].get("app.kubernetes.io/component", ""))


def workload(objs: tuple[dict[str, Any], ...], comp: str) -> dict[str, Any]:
    hits = [o for o in workloads(objs) if component(o) == comp]
    assert len(hits) == 1, f"expected one workload of component {comp}, found {len(hits)}"
    return hits[0]


def main_container(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(pod_spec(obj)["containers"][0])


def secret_values(objs: tuple[dict[str, Any], ...], name: str) -> dict[str, str]:
    """The decoded data of the Secret generated as ``name``."""
    secret = generated(objs, "Secret", name)
    return {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}


def secrets_by_name(objs: tuple[dict[str, Any], ...]) -> dict[str, dict[str, str]]:
    """Every rendered Secret's decoded data, by its rendered name."""
    return {
        o["metadata"]["name"]: {
            k: base64.b64decode(v).decode() for k, v in o.get("data", {}).items()
        }
        for o in find(objs, "Secret")
    }


def base_name(name: str) -> str:
    """A generated object's name without kustomize's hash suffix."""
    return re.sub(r"-[a-z0-9]{10}$", "", name)


def secret_refs(obj: dict[str, Any]) -> Iterator[tuple[str, str | None, bool]]:
    """(Secret name, key or None for a whole Secret, optional) of every reference to a
    Secret in ``obj``: env, envFrom, volumes, projected volumes, KEDA's auth."""
    if obj["kind"] == "TriggerAuthentication":
        for ref in obj["spec"]["secretTargetRef"]:
            yield ref["name"], ref["key"], ref["parameter"] not in ("address", "password")
        return
    if obj["kind"] not in POD_OWNERS:
        return
    spec = pod_spec(obj)
    for container in containers(spec):
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                yield ref["name"], ref["key"], bool(ref.get("optional"))
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                ref = source["secretRef"]
                yield ref["name"], None, bool(ref.get("optional"))
    for volume in spec.get("volumes", []):
        for source in volume.get("projected", {}).get("sources", [volume]):
            ref = source.get("secret")
            if ref:
                name = ref.get("secretName") or ref.get("name")
                yield name, None, bool(ref.get("optional"))


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def rendered_config(objs: tuple[dict[str, Any], ...], tmp: Path) -> Path:
    """The vmpool.yaml the api pods mount, written to ``tmp`` beside the users.yaml of
    the Secret vmpool-users (one projected volume holds both)."""
    path = tmp / "vmpool.yaml"
    path.write_text(generated(objs, "ConfigMap", "vmpool-config")["data"]["vmpool.yaml"])
    users = generated(objs, "Secret", "vmpool-users")
    for key, value in users.get("data", {}).items():
        (tmp / key).write_text(base64.b64decode(value).decode())
    return path


def key_prefix(objs: tuple[dict[str, Any], ...], tmp: Path) -> str:
    from vmpool.config import load_config

    return load_config(rendered_config(objs, tmp), env={}).key_prefix


# -- vmpool's CLI ----------------------------------------------------------------------------


def parse_vmpool(args: list[str]) -> click.Context:
    """Parse ``vmpool ARGS`` with vmpool's click CLI down to the leaf command, without
    running anything; click's UsageError when they do not parse."""
    from vmpool.cli.main import cli

    ctx = cli.make_context("vmpool", list(args))
    while isinstance(ctx.command, click.Group):
        protected = getattr(ctx, "_protected_args", None)
        rest = [*(ctx.protected_args if protected is None else protected), *ctx.args]
        if not rest:
            raise click.UsageError("missing command", ctx)
        name, command, rest = ctx.command.resolve_command(ctx, rest)
        assert name is not None and command is not None
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx


def landed(path: str, marker: str) -> bool:
    """Whether HEAD's version of ``path`` contains ``marker`` (True outside a checkout)."""
    try:
        proc = subprocess.run(
            ["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True, timeout=30
        )
    except OSError:
        return True
    if proc.returncode != 0:
        return True
    return marker in proc.stdout


def metric_landed(metric: str) -> bool:
    """Whether HEAD's vmpool/ source spells the metric's name (True outside a checkout)."""
    return source_mentions(f'"{metric}"')


def sentinel_urls_landed() -> bool:
    """Whether HEAD's vmpool/ source knows the redis+sentinel:// URL form (the Redis
    Sentinel support another part of the work is adding)."""
    return source_mentions("redis+sentinel")


def source_mentions(text: str) -> bool:
    """Whether HEAD's vmpool/ source contains ``text`` (True outside a checkout)."""
    try:
        proc = subprocess.run(
            ["git", "grep", "-q", "-F", text, "HEAD", "--", "vmpool"],
            cwd=ROOT,
            capture_output=True,
            timeout=30,
        )
    except OSError:
        return True
    return proc.returncode != 1 if proc.returncode in (0, 1) else True


def pending_reason(args: list[str]) -> str | None:
    """Why ``vmpool ARGS`` may fail to parse for now (a pending command), or None."""
    for (word, detail), (path, marker) in PENDING.items():
        if args[:1] == [word] and detail in args and not landed(path, marker):
            return f"`vmpool {word} ... {detail}` has not landed in HEAD ({path})"
    return None


def vmpool_commands(
    objs: tuple[dict[str, Any], ...],
) -> Iterator[tuple[str, list[str], dict[str, Any]]]:
    """(where, args after `vmpool`, container) for every vmpool command in the manifests:
    the containers' command + args and their exec probes."""
    for obj, container in all_containers(objs):
        where = f"{obj['kind']} {obj['metadata']['name']} container {container['name']}"
        command = [*container.get("command", []), *container.get("args", [])]
        if command[:1] == ["vmpool"]:
            yield where, command[1:], container
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            exec_ = container.get(probe, {}).get("exec")
            if exec_ and exec_["command"][:1] == ["vmpool"]:
                yield f"{where} {probe}", exec_["command"][1:], container


def container_env(container: dict[str, Any], objs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The container's environment as Kubernetes would give it (secrets resolved)."""
    secrets = secrets_by_name(objs)
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in find(objs, "ConfigMap")}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(secrets.get(source.get("secretRef", {}).get("name", ""), {}))
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
        elif "configMapKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["configMapKeyRef"]
            env[var["name"]] = config_maps[ref["name"]][ref["key"]]
    return env


# -- rendering and validation ------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_renders_with_unique_names(target: str) -> None:
    objs = render(target)
    assert objs, f"{target} renders nothing"
    ids = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(ids) == len(set(ids)), f"{target}: duplicate objects"
    for obj in objs:
        assert obj["metadata"]["labels"].get("app.kubernetes.io/part-of") == "vmpool", (
            f"{target}: {obj['kind']} {obj['metadata']['name']} lacks the part-of label"
        )


def test_overlays_exist() -> None:
    assert set(OVERLAYS) >= {"dev", "prod"}


def _kubernetes_versions() -> list[str]:
    from kubernetes_validate import utils

    versions = sorted(
        {v for v in utils.all_versions()}, key=lambda v: tuple(map(int, v.split(".")))
    )
    chosen = [v for v in versions if tuple(map(int, v.split(".")))[:2] >= MIN_KUBERNETES]
    assert chosen, f"kubernetes-validate bundles no schema from {MIN_KUBERNETES}: {versions}"
    return chosen


@functools.cache
def _crd_validator(kind: str, api_version: str) -> Any:
    import jsonschema
    from referencing import Registry, Resource

    resources = []
    for path in SCHEMAS.glob("*.json"):
        contents = json.loads(path.read_text())
        resources.append((contents["$id"], Resource.from_contents(contents)))
    registry: Registry[Any] = Registry().with_resources(resources)
    group_version = api_version.replace("/", "-")
    path = SCHEMAS / f"{kind.lower()}-{group_version}.json"
    assert path.exists(), f"no schema for {kind} {api_version} (write {path.name})"
    schema = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        schema, registry=registry, format_checker=jsonschema.FormatChecker()
    )


def _is_custom(obj: dict[str, Any]) -> bool:
    group = obj["apiVersion"].rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


@pytest.mark.slow
def test_every_object_validates_strictly(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import kubernetes_validate
        from kubernetes_validate import utils
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: pip install kubernetes-validate")
    # It parses its schema files again for every object (most of its time): once here.
    monkeypatch.setattr(utils, "schema_contents", functools.cache(utils.schema_contents))
    versions = _kubernetes_versions()
    seen: set[str] = set()
    problems: list[str] = []
    for target in TARGETS:
        for obj in render(target):
            # The same object in another target differs only by its namespace and the
            # hash suffixes of generated names: validate it once.
            key = re.sub(r'-[a-z0-9]{10}"', '"', json.dumps(obj, sort_keys=True))
            key = re.sub(r'"namespace": "[^"]*"', '"namespace": ""', key)
            if key in seen:
                continue
            seen.add(key)
            what = f"{target}: {obj['kind']} {obj['metadata']['name']}"
            if _is_custom(obj):
                validator = _crd_validator(obj["kind"], obj["apiVersion"])
                problems += [f"{what}: {e.message}" for e in validator.iter_errors(obj)]
                continue
            for version in versions:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    problems.append(f"{what} (Kubernetes {version}): {exc.message}")
    assert not problems, "\n".join(problems)


def test_the_validators_are_strict() -> None:
    """A misspelt field fails both kinds of validation (the checks above can fail)."""
    import kubernetes_validate

    deployment = json.loads(json.dumps(named(render("base"), "Deployment", "vmpool-api")))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, _kubernetes_versions()[0], strict=True)
    scaled = json.loads(json.dumps(find(render("overlays/prod"), "ScaledObject")[0]))
    scaled["spec"]["minReplicas"] = 1
    assert list(_crd_validator("ScaledObject", scaled["apiVersion"]).iter_errors(scaled))


def test_custom_resources_where_expected() -> None:
    prod, dev = render("overlays/prod"), render("overlays/dev")
    for kind in ("ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule"):
        assert find(prod, kind), f"overlays/prod lacks a {kind}"
    for kind in ("ScaledObject", "HorizontalPodAutoscaler"):
        assert not find(dev, kind), f"overlays/dev autoscales ({kind})"
    assert find(render("base+hpa"), "HorizontalPodAutoscaler")
    assert not find(render("base+keda+external-redis"), "StatefulSet")


# -- images, security, resources -------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_images_are_pinned(target: str) -> None:
    version = importlib.metadata.version("vmpool")
    for obj, container in all_containers(render(target)):
        image = container["image"]
        name, _, tag = image.partition("@")[0].rpartition(":")
        assert "@sha256:" in image or (name and tag and "/" not in tag), f"{image}: no tag"
        assert tag != "latest", f"{obj['metadata']['name']}: {image} uses latest"
        assert container.get("imagePullPolicy") == "IfNotPresent"
        if name == VMPOOL_IMAGE:
            assert tag == version, f"{image}: the image tag is not the project's version"


def test_no_latest_anywhere_in_sources() -> None:
    files = [*K8S.rglob("*.yaml"), ROOT / "Dockerfile"]
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            assert not re.search(r":latest\b", code), f"{path}:{number}: {line.strip()}"


@pytest.mark.parametrize("target", TARGETS)
def test_restricted_security_context(target: str) -> None:
    for obj in workloads(render(target)):
        spec = pod_spec(obj)
        pod_sc = spec.get("securityContext", {})
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(key), f"{obj['metadata']['name']}: {key}"
        assert spec.get("automountServiceAccountToken") is False
        for volume in spec.get("volumes", []):
            assert "hostPath" not in volume, f"{obj['metadata']['name']}: hostPath volume"
        for container in containers(spec):
            where = f"{target}: {obj['metadata']['name']}/{container['name']}"
            sc = container.get("securityContext", {})
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, where
            assert sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0, where
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
            assert seccomp.get("type") == "RuntimeDefault", where
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert not sc.get("privileged"), where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not sc.get("capabilities", {}).get("add"), where
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]], (
                f"{where}: a read-only root needs an emptyDir at /tmp"
            )


@pytest.mark.parametrize("target", TARGETS)
def test_resources_requested_and_limited(target: str) -> None:
    for obj, container in all_containers(render(target)):
        resources = container.get("resources", {})
        for bound in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                where = f"{obj['metadata']['name']}/{container['name']}"
                assert resource in resources.get(bound, {}), (
                    f"{target}: {where}: no {bound}.{resource}"
                )


def test_dockerfile() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    args = dict(m.groups() for m in map(re.compile(r"ARG (\w+)=(\S+)").fullmatch, lines) if m)
    stages = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    assert len(stages) >= 2, "a builder stage and a final stage"
    for i in stages:
        image = lines[i].split()[1]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert re.fullmatch(r"[\w./-]+:[\w.-]+(@sha256:[0-9a-f]{64})?", image), image
        assert not image.endswith(":latest"), image
    final = lines[stages[-1] :]
    final_text = "\n".join(final)
    assert re.search(r"^USER (\d+)(:\d+)?$", final_text, re.M), "final stage: a numeric USER"
    user = re.search(r"^USER (\d+)", final_text, re.M)
    assert user is not None and int(user.group(1)) != 0
    assert 'ENTRYPOINT ["vmpool"]' in final, "exec-form ENTRYPOINT vmpool"
    for tool in ("gcc", "build-essential", "apt-get install", "pip wheel", "COPY . "):
        assert tool not in final_text, f"final stage: {tool}"
    assert "COPY --from=builder /opt/vmpool /opt/vmpool" in final_text, "the builder's venv"
    installs = final_text.replace("uninstall", "")
    assert " install " not in installs, "the final stage installs nothing"
    builder_text = "\n".join(lines[: stages[-1]])
    extras = re.search(r"^ARG VMPOOL_EXTRAS=(\S+)$", builder_text, re.M)
    assert extras, "the builder names the extras it installs"
    assert {"dashboard", "cloud"} <= set(extras.group(1).split(",")), "rq-dashboard, the clouds"
    assert "embedded" not in extras.group(1)
    assert "ldap" in extras.group(1).split(","), "the image can authenticate with LDAP"
    exposed = {int(p) for line in final if line.startswith("EXPOSE") for p in line.split()[1:]}
    api = main_container(workload(render("base"), "api"))
    assert {p["containerPort"] for p in api["ports"]} <= exposed
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[0].strip() == "*" or "*" in ignore, ".dockerignore: an allowlist"


# -- the manifests against the code ------------------------------------------------------------


@pytest.mark.parametrize("target", COMPLETE)
def test_vmpool_commands_parse(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    objs = render(target)
    pending: list[str] = []
    commands = list(vmpool_commands(objs))
    assert commands
    for where, args, container in commands:
        with monkeypatch.context() as m:
            for name, value in container_env(container, objs).items():
                m.setenv(name, value)
            try:
                parse_vmpool(args)
            except click.UsageError as exc:
                reason = pending_reason(args)
                if reason is None:
                    pytest.fail(
                        f"{target}: {where}: `vmpool {' '.join(args)}`: {exc.format_message()}"
                    )
                pending.append(f"{where}: {reason}")
    for line in pending:
        warnings.warn(f"pending command, allowed until it lands: {line}", stacklevel=1)


def test_workers_run_every_queue_and_stop_in_time() -> None:
    from workers.table import JOBS

    longest = max(spec.timeout for spec in JOBS.values())
    for target in TARGETS:
        worker = workload(render(target), "worker")
        grace = pod_spec(worker)["terminationGracePeriodSeconds"]
        assert grace > longest, (
            f"{target}: grace {grace}s is not above the longest job ({longest}s)"
        )
        probe = main_container(worker)["livenessProbe"]["exec"]["command"]
        assert probe == ["vmpool", "probe", "worker", "--max-age", "60"]
        mounts = {m["mountPath"] for m in main_container(worker)["volumeMounts"]}
        assert "/tmp" in mounts, "the heartbeat file /tmp/vmpool-worker-alive needs /tmp"


def test_replicas_and_commands_of_each_process() -> None:
    base = render("base")
    expected = {"api": 2, "scheduler": 2, "worker": 2, "dashboard": 1}
    for comp, replicas in expected.items():
        assert workload(base, comp)["spec"]["replicas"] == replicas, comp
    assert named(base, "StatefulSet", "vmpool-redis")["spec"]["replicas"] == 1
    api = parse_vmpool(main_container(workload(base, "api"))["args"])
    assert api.params["workers"] == 1, "one uvicorn process per pod"
    assert api.params["host"] == "0.0.0.0"
    cron = workload(base, "audit")
    assert cron["kind"] == "CronJob" and cron["spec"]["schedule"] == "*/5 * * * *"
    assert main_container(cron)["args"] == ["audit", "--metrics"]
    for target in TARGETS:
        objs = render(target)
        worker = workload(objs, "worker")
        autoscaled = find(objs, "ScaledObject") or find(objs, "HorizontalPodAutoscaler")
        assert ("replicas" in worker["spec"]) is not bool(autoscaled), (
            f"{target}: the worker Deployment sets replicas iff nothing autoscales it"
        )


@pytest.mark.slow
def test_generated_config_passes_config_check(tmp_path: Path) -> None:
    for target in COMPLETE:
        if target == SENTINEL_SITE and not sentinel_urls_landed():
            warnings.warn(
                "pending: vmpool does not take redis+sentinel:// URLs yet (HEAD's vmpool/);"
                f" {target} is not config-checked",
                stacklevel=1,
            )
            continue
        objs = render(target)
        path = rendered_config(objs, tmp_path)
        api = main_container(workload(objs, "api"))
        env = {"PATH": os.environ.get("PATH", ""), **container_env(api, objs)}
        env["VMPOOL_CONFIG"] = str(path)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "vmpool.cli.main",
                "config",
                "check",
                "--config",
                str(path),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
        )
        assert proc.returncode == 0, f"{target}: {proc.stdout}{proc.stderr}"
        report = json.loads(proc.stdout)
        assert report["ok"] and report["warnings"] == [], f"{target}: {report}"


def test_config_is_mounted_where_vmpool_config_points() -> None:
    for target in TARGETS:
        objs = render(target)
        for where, _args, container in vmpool_commands(objs):
            env = {v["name"]: v.get("value") for v in container.get("env", [])}
            config = env.get("VMPOOL_CONFIG")
            assert config, f"{target}: {where}: no VMPOOL_CONFIG"
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            assert str(Path(config).parent) in mounts, f"{target}: {where}: {config} not mounted"
            names = {v["name"] for v in container["env"]}
            assert "VMPOOL_REDIS_URL" in names


def test_api_probes_and_ports_exist(redis_url: str, redis_client: Any, tmp_path: Path) -> None:
    """The paths the kubelet and Prometheus GET answer 200 on the app the pods run (with
    a real Redis behind it), on the port the pods declare."""
    from fastapi.testclient import TestClient

    from vmpool.config import load_config

    from apihelp import make_app

    base = render("base")
    config = load_config(rendered_config(base, tmp_path), env={})
    paths: set[str] = set()
    for target in TARGETS:
        objs = render(target)
        api = main_container(workload(objs, "api"))
        ports = {p["name"]: p["containerPort"] for p in api["ports"]}
        port_arg = parse_vmpool(api["args"]).params["port"]
        assert ports == {"http": port_arg}, f"{target}: --port {port_arg} against {ports}"
        probes = {name: api[name]["httpGet"] for name in ("livenessProbe", "readinessProbe")}
        assert probes["livenessProbe"]["path"] == "/healthz"
        assert probes["readinessProbe"]["path"] == "/readyz"
        for probe in (*probes.values(), api["startupProbe"]["httpGet"]):
            paths.add(probe["path"])
            assert probe["port"] in ports or probe["port"] in ports.values()
        service = named(objs, "Service", "vmpool-api")
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports or port["targetPort"] in ports.values()
        for monitor in find(objs, "ServiceMonitor"):
            assert selector_matches(monitor["spec"]["selector"], service["metadata"]["labels"])
            for endpoint in monitor["spec"]["endpoints"]:
                assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
                paths.add(endpoint["path"])
        dashboard = main_container(workload(objs, "dashboard"))
        args = dashboard["args"]
        dash_port = int(args[args.index("--port") + 1])
        assert [p["containerPort"] for p in dashboard["ports"]] == [dash_port]
    assert paths == {"/healthz", "/readyz", "/metrics"}
    with TestClient(make_app(config, redis_url)) as client:
        for path in sorted(paths):
            response = client.get(path)
            assert response.status_code == 200, (
                f"GET {path}: {response.status_code} {response.text}"
            )


def test_keda_lists_are_the_queues_workers_listen_on(tmp_path: Path) -> None:
    """The autoscalers watch exactly the RQ queues the workers listen on and the work
    sets of the code (vmpool.api.backlog_metrics.BACKLOG_JOBS), under the config's
    key prefix."""
    from vmpool.api.backlog_metrics import BACKLOG_JOBS
    from vmpool.state.keys import Keys
    from workers.queues import resolve_queue_names
    from workers.table import QUEUES

    checked = 0
    for target in COMPLETE:
        objs = render(target)
        keys = Keys(key_prefix(objs, tmp_path))
        worker = workload(objs, "worker")
        queues_text = parse_vmpool(main_container(worker)["args"]).params["queues_text"]
        listened = resolve_queue_names(keys, queues_text)
        lists = [keys.rq_queue(short) for short in QUEUES if keys.queue(short) in listened]
        assert len(lists) == len(listened)
        redis_url = urlsplit(secret_values(objs, "vmpool-redis-client")["redis-url"])
        # redis://host/DB, or redis+sentinel://hosts/MASTER/DB
        path = redis_url.path.strip("/").split("/")
        database = (path[1:] if redis_url.scheme == "redis+sentinel" else path)[:1] or ["0"]
        database = [database[0] or "0"]
        for scaled in find(objs, "ScaledObject"):
            checked += 1
            spec = scaled["spec"]
            assert spec["scaleTargetRef"]["name"] == worker["metadata"]["name"]
            assert spec["minReplicaCount"] >= 1, "the sweeps run only in workers"
            triggers = spec["triggers"]
            work_sets = [keys.work_set(job) for job in BACKLOG_JOBS]
            assert [t["metadata"]["listName"] for t in triggers] == lists + work_sets, target
            for trigger in triggers:
                assert trigger["type"] == ("redis-sentinel" if target == SENTINEL_SITE else "redis")
                assert trigger["metadata"].get("databaseIndex", "0") == database[0]
                auth = named(objs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
                refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
                # KEDA's redis scaler parameters: the connection, ACL and TLS ones.
                expected = {"address", "password", "username", "tls", "ca", "cert", "key"}
                if target == SENTINEL_SITE:
                    expected |= {"sentinelMaster", "sentinelPassword", "sentinelUsername"}
                assert set(refs) == expected
                assert {base_name(r["name"]) for r in refs.values()} == {"vmpool-keda"}
                assert all(r["key"] == p for p, r in refs.items())
        for hpa in find(objs, "HorizontalPodAutoscaler"):
            checked += 1
            assert hpa["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
            assert hpa["spec"]["minReplicas"] >= 1
            queues, backlog = hpa["spec"]["metrics"]
            assert queues["external"]["metric"]["name"] == "vmpool_queue_depth"
            (expr,) = queues["external"]["metric"]["selector"]["matchExpressions"]
            assert expr["key"] == "queue" and expr["values"] == listened
            assert backlog["external"]["metric"]["name"] == "vmpool_work_backlog"
            (expr,) = backlog["external"]["metric"]["selector"]["matchExpressions"]
            assert expr["key"] == "job" and expr["values"] == list(BACKLOG_JOBS)
    assert checked >= 3


@pytest.mark.parametrize("target", TARGETS)
def test_references_resolve(target: str) -> None:
    """Every Secret/ConfigMap key a pod reads exists (a Secret the operator supplies is
    one of the documented ones, not rendered here); every selector selects something."""
    objs = render(target)
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in find(objs, "ConfigMap")}
    secrets = {o["metadata"]["name"]: o.get("data", {}) for o in find(objs, "Secret")}
    rendered = {base_name(name) for name in secrets}
    accounts = {o["metadata"]["name"] for o in find(objs, "ServiceAccount")}
    for obj in objs:
        for name, key, optional in secret_refs(obj):
            where = f"{target}: {obj['kind']} {obj['metadata']['name']}: Secret {name} {key}"
            if name in secrets:
                assert key is None or key in secrets[name] or optional, where
            else:
                assert name in OPERATOR_SECRETS, f"{where}: not a documented Secret"
                assert name not in rendered, f"{where}: rendered under another name"
                assert target != SITE or optional, f"{where}: the site generates it"
    for obj in workloads(objs):
        spec = pod_spec(obj)
        assert spec["serviceAccountName"] in accounts
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, volume
        for container in containers(spec):
            for var in container.get("env", []):
                source = var.get("valueFrom", {})
                if "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    assert ref["key"] in config_maps.get(ref["name"], {}), f"{target}: {ref}"
    pods = [pod_labels(o) for o in workloads(objs)]
    for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
        for obj in find(objs, kind):
            selector = obj["spec"].get("podSelector") if kind == "NetworkPolicy" else None
            if kind == "Service":
                selector = {"matchLabels": obj["spec"]["selector"]}
            elif kind == "PodDisruptionBudget":
                selector = obj["spec"]["selector"]
            assert selector is not None
            assert any(selector_matches(selector, labels) for labels in pods), (
                f"{target}: {kind} {obj['metadata']['name']} selects no pod"
            )
    for service in find(objs, "Service"):
        for port in service["spec"]["ports"]:
            target_port = port["targetPort"]
            owners = [
                o
                for o in workloads(objs)
                if selector_matches({"matchLabels": service["spec"]["selector"]}, pod_labels(o))
            ]
            names = {
                p.get("name")
                for o in owners
                for c in containers(pod_spec(o))
                for p in c.get("ports", [])
            }
            assert target_port in names, (
                f"{target}: Service {service['metadata']['name']} port {target_port}"
            )


@pytest.mark.parametrize("target", TARGETS)
def test_redis_reached_only_by_vmpool_keda_and_the_dashboard(target: str) -> None:
    objs = render(target)
    policies = [p for p in find(objs, "NetworkPolicy") if component(p) == "redis"]
    if not find(objs, "StatefulSet"):
        assert not policies, f"{target}: a Redis NetworkPolicy without the in-cluster Redis"
        return
    (policy,) = policies
    redis = named(objs, "StatefulSet", "vmpool-redis")
    assert selector_matches(policy["spec"]["podSelector"], pod_labels(redis))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # The pods that are given the Redis URL are exactly the pods admitted.
    clients = {
        component(o)
        for o in workloads(objs)
        for c in containers(pod_spec(o))
        for v in c.get("env", [])
        if v.get("valueFrom", {}).get("secretKeyRef", {}).get("key") == "redis-url"
    }
    admitted: set[str] = set()
    namespaces: list[dict[str, Any]] = []
    for rule in policy["spec"]["ingress"]:
        assert [p["port"] for p in rule["ports"]] == ["redis"]
        for source in rule["from"]:
            if "namespaceSelector" in source:
                assert "podSelector" not in source
                namespaces.append(source["namespaceSelector"])
                continue
            admitted |= {
                component(o)
                for o in workloads(objs)
                if selector_matches(source["podSelector"], pod_labels(o))
            }
    assert admitted == clients == {"api", "worker", "scheduler", "audit", "dashboard"}
    keda = [{"matchLabels": {"kubernetes.io/metadata.name": "keda"}}]
    assert namespaces == (keda if find(objs, "ScaledObject") else []), target
    api_policy = named(objs, "NetworkPolicy", "vmpool-api")
    assert api_policy["spec"]["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]


def _bytes(quantity: str) -> int:
    """A Kubernetes quantity (Mi, Gi) or a Redis memory size (mb, gb) in bytes."""
    units = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "kb": 2**10, "mb": 2**20, "gb": 2**30, "": 1}
    match = re.fullmatch(r"(\d+)([a-z]*)", quantity.strip().lower())
    assert match and match.group(2) in units, quantity
    return int(match.group(1)) * units[match.group(2)]


@pytest.mark.parametrize("target", COMPLETE)
def test_redis_keeps_every_write(target: str) -> None:
    objs = render(target)
    if not find(objs, "StatefulSet") or target == SENTINEL_SITE:
        return  # no in-cluster Redis; the Sentinel variant: test_redis_sentinel
    redis = named(objs, "StatefulSet", "vmpool-redis")
    container = main_container(redis)
    volumes = {v["name"]: v for v in pod_spec(redis)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    conf_path = Path(container["args"][0])
    conf_map = named(objs, "ConfigMap", volumes[mounts[str(conf_path.parent)]]["configMap"]["name"])
    directives = {}
    for line in conf_map["data"][conf_path.name].splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            directives[key] = value
    assert directives["appendonly"] == "yes"
    assert directives["appendfsync"] == "always"
    assert directives["maxmemory-policy"] == "noeviction"
    claims = {c["metadata"]["name"] for c in redis["spec"]["volumeClaimTemplates"]}
    assert mounts[directives["dir"]] in claims, "the data directory is the persistent volume"
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    env = {v["name"]: v["valueFrom"] for v in container["env"]}
    assert env["REDIS_PASSWORD"]["secretKeyRef"]["key"] == "password"
    assert base_name(env["REDIS_PASSWORD"]["secretKeyRef"]["name"]) == "vmpool-redis-server"
    maxmemory_ref = env[args[args.index("--maxmemory") + 1].strip("$()")]["configMapKeyRef"]
    maxmemory = named(objs, "ConfigMap", maxmemory_ref["name"])["data"][maxmemory_ref["key"]]
    limit = container["resources"]["limits"]["memory"]
    assert _bytes(maxmemory) < _bytes(limit), f"{target}: maxmemory {maxmemory} >= limit {limit}"
    # The Secrets' Redis coordinates agree with each other and name the Service.
    url = urlsplit(secret_values(objs, "vmpool-redis-client")["redis-url"])
    assert url.password == secret_values(objs, "vmpool-redis-server")["password"]
    service = named(objs, "Service", url.hostname or "")
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    if find(objs, "ScaledObject"):  # KEDA connects from its own namespace
        keda = secret_values(objs, "vmpool-keda")
        assert keda["password"] == url.password
        host, _, port = keda["address"].rpartition(":")
        assert int(port) == url.port
        namespace = redis["metadata"].get("namespace")
        assert host in {
            f"{url.hostname}.{namespace}.svc",
            f"{url.hostname}.{namespace}.svc.cluster.local",
        }


def test_dev_has_a_small_redis() -> None:
    dev, prod = render("overlays/dev"), render("overlays/prod")

    def sizes(objs: tuple[dict[str, Any], ...]) -> tuple[int, int]:
        redis = named(objs, "StatefulSet", "vmpool-redis")
        storage = redis["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"][
            "storage"
        ]
        return _bytes(main_container(redis)["resources"]["limits"]["memory"]), _bytes(storage)

    assert sizes(dev) < sizes(prod)


# -- monitoring ------------------------------------------------------------------------------

METRIC_RE = re.compile(r"\b(vmpool(?:er)?_[A-Za-z0-9_]+)")
SELECTOR_RE = re.compile(r"\b(vmpool(?:er)?_[A-Za-z0-9_]+)\{([^}]*)\}")


def _all_rules() -> list[dict[str, Any]]:
    (rule,) = find(render("overlays/prod"), "PrometheusRule")
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def _rules() -> list[dict[str, Any]]:
    """The alerting rules (the recording rules aside)."""
    return [r for r in _all_rules() if "alert" in r]


def _dashboard() -> dict[str, Any]:
    objs = render("overlays/prod")
    (cm,) = [
        o
        for o in find(objs, "ConfigMap")
        if o["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    (text,) = cm["data"].values()
    return dict(json.loads(text))


def _dashboard_queries(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition", "query") and isinstance(value, str):
                yield value
            else:
                yield from _dashboard_queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_queries(item)


def _queries() -> dict[str, list[str]]:
    """Every PromQL text of the monitoring component, by where it comes from."""
    out: dict[str, list[str]] = {}
    for rule in _all_rules():
        where = f"alert {rule['alert']}" if "alert" in rule else f"record {rule['record']}"
        out.setdefault(where, []).append(rule["expr"])
    for query in _dashboard_queries(_dashboard()):
        if METRIC_RE.search(query):
            out.setdefault("grafana dashboard", []).append(query)
    hpa = find(render("base+hpa"), "HorizontalPodAutoscaler")[0]
    out["hpa"] = [m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    return out


def test_alerts() -> None:
    rules = {r["alert"]: r for r in _rules()}
    assert set(rules) == ALERTS
    assert rules["VmpoolQueueGrowing"]["for"] == "10m"
    assert rules["VmpoolCloneSlotsSaturated"]["for"] == "15m"
    assert "[10m]" in rules["VmpoolQueueGrowing"]["expr"]
    assert "[15m]" in rules["VmpoolOnDemandFailureRatioHigh"]["expr"]
    assert 'job="sweep_expired"' in rules["VmpoolExpirySweepLate"]["expr"]
    assert "offset 30m" in rules["VmpoolAuditStale"]["expr"]
    assert "vmpool_redis_up[6h]" in rules["VmpoolApiNotScraped"]["expr"]
    for rule in rules.values():
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")"), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert {"summary", "description", "runbook"} <= set(rule["annotations"])


def test_every_alert_has_a_runbook_line() -> None:
    text = OPERATIONS_MD.read_text()
    assert "## Kubernetes" in text
    runbook = text.split("### Alerts", 1)
    assert len(runbook) == 2, "docs/operations.md has no '### Alerts' section"
    for alert in ALERTS:
        assert f"`{alert}`" in runbook[1], f"docs/operations.md: no runbook line for {alert}"
    for rule in _rules():
        assert rule["annotations"]["runbook"] == "docs/operations.md#alerts"


def test_grafana_dashboard() -> None:
    objs = render("overlays/prod")
    (cm,) = [
        o
        for o in find(objs, "ConfigMap")
        if o["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    assert not re.search(r"-[a-z0-9]{10}$", cm["metadata"]["name"]), (
        "a fixed name: updated in place"
    )
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), panel["title"]
    named_metrics = {m for q in _dashboard_queries(dashboard) for m in METRIC_RE.findall(q)}
    for metric in (
        "vmpool_vms",
        "vmpool_requests_open",
        "vmpool_time_to_ready_seconds_bucket",
        "vmpool_worker_jobs_total",
        "vmpool_queue_depth",
    ):
        assert metric in named_metrics, f"the dashboard does not show {metric}"


def _scrape(redis_url: str, tmp_path: Path) -> dict[str, set[str]]:
    """Metric name -> label names, from a live /metrics of the app the api pods run
    (after `vmpool audit --metrics` when that command exists, as the CronJob runs it)."""
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from vmpool.cli.audit import audit_command
    from vmpool.config import load_config

    from apihelp import make_app

    objs = render(SITE)
    path = rendered_config(objs, tmp_path)
    config = load_config(path, env={})
    if any("--metrics" in p.opts for p in audit_command.params):
        env = {
            "PATH": os.environ.get("PATH", ""),
            "VMPOOL_CONFIG": str(path),
            "VMPOOL_REDIS_URL": redis_url,
        }
        proc = subprocess.run(
            [sys.executable, "-m", "vmpool.cli.main", "audit", "--metrics"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    with TestClient(make_app(config, redis_url)) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(response.text):
        names = {family.name, *(s.name for s in family.samples)}
        if family.type == "counter":
            names.add(f"{family.name}_total")
        labels = {label for s in family.samples for label in s.labels}
        for name in names:
            exported.setdefault(name, set()).update(labels)
    return exported


def test_every_metric_of_the_alerts_and_dashboard_is_exported(
    redis_url: str, redis_client: Any, tmp_path: Path
) -> None:
    exported = _scrape(redis_url, tmp_path)
    missing: dict[str, set[str]] = {}
    wrong_labels: list[str] = []
    for where, queries in _queries().items():
        for query in queries:
            for metric in METRIC_RE.findall(query):
                if metric not in exported:
                    missing.setdefault(metric, set()).add(where)
            for metric, matchers in SELECTOR_RE.findall(query):
                labels = {m.split("=")[0].strip(" !~") for m in matchers.split(",") if "=" in m}
                labels.discard("namespace")  # a target label Prometheus adds
                if metric in exported and exported[metric] and not labels <= exported[metric]:
                    wrong_labels.append(
                        f"{where}: {metric} has no label {labels - exported[metric]}"
                    )
    for metric in PENDING_METRICS:
        if metric in missing and not metric_landed(metric):
            warnings.warn(f"pending metric, allowed until it lands: {metric}", stacklevel=1)
            del missing[metric]
    report = [f"{m} (used by {', '.join(sorted(w))})" for m, w in sorted(missing.items())]
    assert not missing and not wrong_labels, "metrics not exported by /metrics:\n  " + "\n  ".join(
        report + wrong_labels
    )


def test_rq_dashboard_options() -> None:
    """The dashboard container's arguments and RQ_DASHBOARD_* variables are options of
    the rq-dashboard the image installs (its `dashboard` extra)."""
    try:
        from rq_dashboard.cli import run
    except ImportError:
        pytest.skip("rq-dashboard (vmpool's `dashboard` extra) is not installed here")
    dashboard = main_container(workload(render("base"), "dashboard"))
    assert dashboard["command"] == ["rq-dashboard"]
    ctx = run.make_context(
        "rq-dashboard", list(dashboard["args"]), auto_envvar_prefix="RQ_DASHBOARD"
    )
    assert ctx.params["port"] == dashboard["ports"][0]["containerPort"]
    options = {f"RQ_DASHBOARD_{p.name.upper()}" for p in run.params if p.name}
    env = {v["name"] for v in dashboard["env"] if v["name"].startswith("RQ_DASHBOARD_")}
    assert env == {"RQ_DASHBOARD_REDIS_URL", "RQ_DASHBOARD_USERNAME", "RQ_DASHBOARD_PASSWORD"}
    assert env <= options


def test_api_users_come_from_a_secret_not_the_configmap(tmp_path: Path) -> None:
    """Proves: in every overlay the API users' password hashes are in the Secret
    vmpool-users (mounted beside vmpool.yaml, named by :auth: users_file), none in a
    ConfigMap, and the config the pods load has those users."""
    from vmpool.config import load_config

    for target in COMPLETE:
        objs = render(target)
        for config_map in find(objs, "ConfigMap"):
            text = json.dumps(config_map.get("data", {}))
            assert "pbkdf2_sha256$" not in text and "sha256$" not in text, target
        secret = generated(objs, "Secret", "vmpool-users")
        users = yaml.safe_load(base64.b64decode(secret["data"]["users.yaml"]).decode())
        auth = load_config(rendered_config(objs, tmp_path), env={}).auth
        assert auth is not None and set(auth.users) == set(users) and users, target
        for kind in ("api", "worker", "scheduler"):
            volumes = json.dumps(pod_spec(workload(objs, kind)).get("volumes", []))
            assert secret["metadata"]["name"] in volumes, (target, kind)


# -- Secrets ---------------------------------------------------------------------------------

# Who reads each Secret: the pods that must roll when it changes (and nothing else).
CONSUMERS: dict[str, set[str]] = {
    "vmpool-redis-client": {"api", "worker", "scheduler", "audit", "dashboard"},
    "vmpool-users": {"api", "worker", "scheduler", "audit"},
    "vmpool-redis-server": {"redis"},
    "vmpool-dashboard": {"dashboard"},
    "vmpool-keda": set(),  # KEDA's TriggerAuthentication only
    "vmpool-cloud": {"worker", "audit"},
    "vmpool-cloud-files": {"worker", "audit"},
}


def test_prod_renders_no_secret_and_no_placeholder() -> None:
    """overlays/prod renders no Secret at all (the operator supplies them), every
    reference to one is a documented plain name, and no placeholder value of the
    development Secrets appears anywhere in it."""

    def text(objs: tuple[dict[str, Any], ...]) -> str:  # Secrets' data decoded
        return json.dumps(objs) + json.dumps(secrets_by_name(objs))

    objs = render("overlays/prod")
    assert not find(objs, "Secret")
    for placeholder in PLACEHOLDERS:
        assert placeholder not in text(objs), f"overlays/prod carries a placeholder: {placeholder}"
    names = {name for obj in objs for name, _, _ in secret_refs(obj)}
    assert names == set(OPERATOR_SECRETS), names
    # and the development overlay does carry them: the check above can fail
    assert all(p in text(render("overlays/dev")) for p in PLACEHOLDERS)


def test_operator_created_secrets_work() -> None:
    """Secrets made outside kustomize (kubectl create secret, an external-secrets
    operator) keep their plain names, and overlays/prod's references are those names:
    rendered together, every reference resolves to them unchanged."""
    plain = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": "vmpool"},
            "stringData": values,
        }
        for name, values in SITE_SECRETS.items()
    ]
    text = render_kustomization(
        lambda rel: {"resources": [f"{rel}/overlays/prod", "secrets.yaml"]},
        {"secrets.yaml": yaml.safe_dump_all(plain)},
    )
    objs = tuple(doc for doc in yaml.safe_load_all(text) if doc)
    made = {o["metadata"]["name"]: o for o in find(objs, "Secret")}
    assert set(made) == set(SITE_SECRETS), "kustomize renamed an operator's Secret"
    for obj in objs:
        for name, key, optional in secret_refs(obj):
            assert name in made, f"{obj['kind']} {obj['metadata']['name']}: {name}"
            assert key is None or optional or key in made[name]["stringData"], (name, key)


def _pod_templates(objs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """component -> its pod template (what a change of makes Kubernetes roll the pods),
    plus KEDA's TriggerAuthentication, as text."""
    out = {component(o): json.dumps(o["spec"], sort_keys=True) for o in workloads(objs)}
    for auth in find(objs, "TriggerAuthentication"):
        out["keda"] = json.dumps(auth["spec"], sort_keys=True)
    return out


@pytest.mark.parametrize("secret", sorted(CONSUMERS))
def test_changing_one_secret_rolls_only_its_consumers(secret: str) -> None:
    """A site generates its Secrets (kustomize names each after a hash of its content
    and rewrites the references): changing one value re-renders exactly the pods that
    read that Secret, the ones CONSUMERS lists, which are the ones that reference it."""
    before = render(SITE)
    changed = json.loads(json.dumps(SITE_SECRETS))
    key = sorted(changed[secret])[0]
    changed[secret][key] += "-rotated"
    after = tuple(doc for doc in yaml.safe_load_all(render_site(json.dumps(changed))) if doc)
    old, new = _pod_templates(before), _pod_templates(after)
    rolled = {name for name in old if old[name] != new[name]}
    expected = CONSUMERS[secret] | ({"keda"} if secret == "vmpool-keda" else set())
    assert rolled == expected, f"changing {secret} re-renders {sorted(rolled)}"
    referencing = {
        component(o) if o["kind"] in POD_OWNERS else "keda"
        for o in before
        for name, _, _ in secret_refs(o)
        if base_name(name) == secret
    }
    assert referencing == expected


def test_ingress_serves_the_api_over_tls_and_trusts_its_proxies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """components/ingress: a TLS Ingress to the API Service's port, and the API told
    (by its environment, as the container gets it) which proxies to believe."""
    objs = render("base+ingress")
    (ingress,) = find(objs, "Ingress")
    assert ingress["spec"]["tls"] and ingress["spec"]["tls"][0]["secretName"]
    hosts = {h for t in ingress["spec"]["tls"] for h in t["hosts"]}
    service = named(objs, "Service", "vmpool-api")
    for rule in ingress["spec"]["rules"]:
        assert rule["host"] in hosts, "every host is served over TLS"
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            assert backend["name"] == service["metadata"]["name"]
            assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    api = main_container(workload(objs, "api"))
    env = container_env(api, objs)
    with monkeypatch.context() as m:
        for name, value in env.items():
            m.setenv(name, value)
        params = parse_vmpool(api["args"]).params
    assert params["forwarded_allow_ips"] == env["VMPOOL_FORWARDED_ALLOW_IPS"]
    assert params["forwarded_allow_ips"] not in (None, "*")


def test_redis_sentinel() -> None:
    """components/redis-sentinel on overlays/prod: three Redis pods with a Sentinel each
    (Redis keeps redis.conf's durability: the same ConfigMap), no Service that would
    spread clients over replicas, vmpool's URL naming every sentinel pod, KEDA's
    triggers through the sentinels' Service and master name, the start scripts valid sh
    (run for real by tests/test_redis_sentinel_start.py), min-replicas-to-write set, the
    pods started together."""
    objs = render(SENTINEL_SITE)
    redis = named(objs, "StatefulSet", "vmpool-redis")
    assert redis["spec"]["replicas"] == 3
    spec = pod_spec(redis)
    by_name = {c["name"]: c for c in spec["containers"]}
    assert set(by_name) == {"redis", "sentinel"}
    scripts_volume = {v["name"]: v for v in spec["volumes"]}["scripts"]
    scripts = named(objs, "ConfigMap", scripts_volume["configMap"]["name"])["data"]
    start_redis = scripts["start-redis.sh"]
    assert by_name["redis"]["command"] == ["sh", "/scripts/start-redis.sh"]
    assert by_name["sentinel"]["command"] == ["sh", "/scripts/start-sentinel.sh"]
    assert 'exec "${REDIS_SERVER:-redis-server}" "$@"' in start_redis
    assert 'set -- "${REDIS_CONF:-/etc/redis/redis.conf}" --requirepass "${REDIS_PASSWORD}"' in (
        start_redis
    )
    # a primary refuses writes without a replica (docs/operations.md recommends it)
    assert '--min-replicas-to-write "${MIN_REPLICAS_TO_WRITE:-1}"' in start_redis
    # the scripts' defaults name the pods as the StatefulSet does (tests/
    # test_redis_sentinel_start.py runs them with the addresses given instead): one
    # file of addresses, sourced by both from the same ConfigMap
    addresses = scripts["addresses.sh"]
    assert 'set_name="${STATEFULSET_NAME:-vmpool-redis}"' in addresses
    assert 'domain="${set_name}-headless.' in addresses
    assert '"${REDIS_PODS:-3}"' in addresses
    for name in ("start-redis.sh", "start-sentinel.sh"):
        assert '. "$(dirname "$0")/addresses.sh"' in scripts[name]
    assert redis["metadata"]["name"] == "vmpool-redis"
    assert redis["spec"]["serviceName"] == "vmpool-redis-headless"
    # the pods start together: an empty one waits for the others, which OrderedReady
    # would keep from starting
    assert redis["spec"]["podManagementPolicy"] == "Parallel"
    assert by_name["redis"]["startupProbe"]["failureThreshold"] >= 60
    mounts = {m["mountPath"]: m["name"] for m in by_name["redis"]["volumeMounts"]}
    conf = named(
        objs,
        "ConfigMap",
        {v["name"]: v for v in spec["volumes"]}[mounts["/etc/redis"]]["configMap"]["name"],
    )["data"]["redis.conf"]
    for line in ("appendonly yes", "appendfsync always", "maxmemory-policy noeviction"):
        assert line in conf.splitlines()
    assert {m["mountPath"] for m in by_name["sentinel"]["volumeMounts"]} >= {"/data", "/tmp"}
    for name, text in scripts.items():
        check = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, f"{name}: {check.stderr}"
    services = {s["metadata"]["name"]: s for s in find(objs, "Service")}
    assert "vmpool-redis" not in services, "no Service spreading clients over the replicas"
    sentinel_service = services["vmpool-redis-sentinel"]
    assert [p["port"] for p in sentinel_service["spec"]["ports"]] == [26379]
    env = {v["name"]: v for v in by_name["sentinel"]["env"]}
    master = env["SENTINEL_MASTER"]["value"]
    url = urlsplit(secret_values(objs, "vmpool-redis-client")["redis-url"])
    assert url.scheme == "redis+sentinel"
    # Every sentinel by its pod's stable name: vmpool believes the primary a majority of
    # the listed sentinels name, which a single Service address would reduce to one.
    headless = redis["spec"]["serviceName"]
    assert services[headless]["spec"]["clusterIP"] == "None"
    assert url.netloc.rpartition("@")[2].split(",") == [
        f"vmpool-redis-{i}.{headless}:26379" for i in range(redis["spec"]["replicas"])
    ]
    assert url.path.strip("/").split("/")[0] == master
    keda = secret_values(objs, "vmpool-keda")
    assert keda["sentinelMaster"] == master
    assert keda["address"].startswith("vmpool-redis-sentinel.vmpool.svc")
    assert {t["type"] for t in find(objs, "ScaledObject")[0]["spec"]["triggers"]} == {
        "redis-sentinel"
    }
    auth = find(objs, "TriggerAuthentication")[0]["spec"]["secretTargetRef"]
    assert {"sentinelMaster", "sentinelPassword"} <= {r["parameter"] for r in auth}
    policy = named(objs, "NetworkPolicy", "vmpool-redis-sentinel")
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert ports == {"redis", "sentinel"}
