"""Helpers shared by the Kubernetes tests: deploy/k8s rendered by ``kubectl kustomize``
(overlays, component combinations, a site's own overlay), objects found by kind."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"


# Combinations rendered from a temporary kustomization, so that every component is
# rendered at least once, alone or as the docs combine them (with the development
# placeholder Secrets, so that they are complete).
COMBINATIONS: dict[str, tuple[str, ...]] = {
    "base": ("dev-secrets",),
    "base+hpa": ("dev-secrets", "hpa"),
    "base+monitoring": ("dev-secrets", "monitoring"),
    "base+keda+external-redis": ("dev-secrets", "keda", "external-redis"),
    "base+ingress": ("dev-secrets", "ingress"),
}


# An operator's overlay on top of overlays/prod generating every Secret (test values):
# what docs/operations.md tells a site to write. A change of one value there must roll
# exactly the pods that read it.
SITE_SECRETS: dict[str, dict[str, str]] = {
    "vmpool-redis-client": {"redis-url": "redis://:site-redis-pw@vmpool-redis:6379/0"},
    "vmpool-users": {"users.yaml": "alice: 'pbkdf2_sha256$600000$c2FsdA$" + "0" * 64 + "'\n"},
    "vmpool-redis-server": {"password": "site-redis-pw"},
    "vmpool-dashboard": {"username": "ops", "password": "site-dashboard-pw"},
    "vmpool-keda": {
        "address": "vmpool-redis.vmpool.svc.cluster.local:6379",
        "password": "site-redis-pw",
    },
    "vmpool-cloud": {"AWS_ACCESS_KEY_ID": "AKIDSITE", "AWS_SECRET_ACCESS_KEY": "site-aws"},
    "vmpool-cloud-files": {"clouds.yaml": "clouds: {}\n"},
}


SITE = "site/prod"


# The same site with Redis Sentinel (components/redis-sentinel on top of overlays/prod):
# vmpool and KEDA reach Redis through the sentinels.
SENTINEL_SITE = "site/prod+sentinel"


SENTINEL_SECRETS: dict[str, dict[str, str]] = {
    **SITE_SECRETS,
    "vmpool-redis-client": {
        "redis-url": "redis+sentinel://:site-redis-pw@vmpool-redis-0.vmpool-redis-headless:26379,"
        "vmpool-redis-1.vmpool-redis-headless:26379,vmpool-redis-2.vmpool-redis-headless:26379"
        "/vmpool/0"
    },
    "vmpool-redis-server": {"password": "site-redis-pw", "sentinel-password": "site-sentinel-pw"},
    "vmpool-keda": {
        "address": "vmpool-redis-sentinel.vmpool.svc.cluster.local:26379",
        "password": "site-redis-pw",
        "sentinelMaster": "vmpool",
        "sentinelPassword": "site-sentinel-pw",
    },
}


@functools.cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    """The objects ``kubectl kustomize`` renders for an overlay, a combination, or the
    site overlay on top of overlays/prod."""
    if target in COMBINATIONS:
        text = render_kustomization(
            lambda rel: {
                "resources": [f"{rel}/base"],
                "components": [f"{rel}/components/{c}" for c in COMBINATIONS[target]],
            }
        )
    elif target == SITE:
        text = render_site(json.dumps(SITE_SECRETS))
    elif target == SENTINEL_SITE:
        text = render_site(json.dumps(SENTINEL_SECRETS), ("redis-sentinel",))
    else:
        text = _kustomize(str(K8S / target))
    return tuple(doc for doc in yaml.safe_load_all(text) if doc)


@functools.cache
def render_site(secrets_json: str, components: tuple[str, ...] = ()) -> str:
    """overlays/prod under an overlay generating ``secrets_json``'s Secrets, as a site's
    own overlay would (the namespace too: kustomize matches references in it), with
    ``components`` added."""
    secrets: dict[str, dict[str, str]] = json.loads(secrets_json)
    return render_kustomization(
        lambda rel: {
            "namespace": "vmpool",
            "resources": [f"{rel}/overlays/prod"],
            "components": [f"{rel}/components/{c}" for c in components],
            "secretGenerator": [
                {"name": name, "literals": [f"{k}={v}" for k, v in sorted(values.items())]}
                for name, values in secrets.items()
            ],
            "generatorOptions": {"labels": {"app.kubernetes.io/part-of": "vmpool"}},
        }
    )


def render_kustomization(body: Any, extra_files: dict[str, str] | None = None) -> str:
    """Render a temporary kustomization; ``body(rel)`` gets the path of deploy/k8s
    relative to it (kustomize refuses absolute paths)."""
    with tempfile.TemporaryDirectory(prefix="vmpool-kustomize-") as tmp:
        rel = os.path.relpath(K8S, tmp)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            **body(rel),
        }
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        for name, text in (extra_files or {}).items():
            (Path(tmp) / name).write_text(text)
        return _kustomize(tmp)


def _kustomize(directory: str) -> str:
    proc = subprocess.run(
        ["kubectl", "kustomize", directory], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return proc.stdout


def find(objs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]
