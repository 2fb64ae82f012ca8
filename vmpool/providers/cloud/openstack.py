"""OpenStack (Nova) through libcloud's OpenStack driver (Keystone v3 password auth).

Tags are server metadata given in the create call (``ex_metadata``: no untagged
window). Nova lists servers without a metadata filter, so the fleet's servers are
picked from one ``GET /servers/detail`` by their ``vmpool-fleet`` metadata. Nova has no
idempotency token: a create is retried only after a lookup by tag found nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from vmpool.providers.base import PermanentProviderError
from vmpool.providers.cloud.clouds_yaml import CloudEntry, cloud_name, load_cloud
from vmpool.providers.cloud.common import CloudOptions, CloudProvider, Node, Secret

__all__ = ["OpenStackOptions", "OpenStackProvider"]


class OpenStackOptions(CloudOptions):
    """``provider_class: openstack``. Credentials: the options, else the entry ``cloud``
    (or OS_CLOUD) of a clouds.yaml (OS_CLIENT_CONFIG_FILE, or the clients' search path:
    :mod:`vmpool.providers.cloud.clouds_yaml`), else the usual OS_* environment
    variables (OS_AUTH_URL, OS_USERNAME, OS_PASSWORD, OS_PROJECT_NAME,
    OS_USER_DOMAIN_NAME, OS_REGION_NAME)."""

    cloud: str | None = Field(None, description="A clouds.yaml entry (default: OS_CLOUD)")

    auth_url: str | None = Field(None, description="Keystone URL (default: OS_AUTH_URL)")
    username: str | None = Field(None, description="User (default: OS_USERNAME)")
    password: Secret | None = Field(None, description="Password (secret; OS_PASSWORD)")
    project_name: str | None = Field(None, description="Project (default: OS_PROJECT_NAME)")
    domain_name: str | None = Field(None, description="User domain (OS_USER_DOMAIN_NAME)")
    region: str | None = Field(None, description="Region (default: OS_REGION_NAME)")
    flavor: str = Field(description="The flavor id servers are made with")
    network: str | None = Field(None, description="The network id servers attach to")
    key_name: str | None = Field(None, description="The key pair installed on servers")
    security_groups: list[str] = Field(default_factory=list, description="Security groups")


class OpenStackProvider(CloudProvider):
    options_model = OpenStackOptions
    provider_class = "openstack"
    options: OpenStackOptions

    def driver_args(self) -> tuple[tuple[str, str], dict[str, Any]]:
        o = self.options
        entry = self._cloud_entry()

        def env(option: str | None, field: str, variable: str) -> str | None:
            return option or getattr(entry, field, None) or os.environ.get(variable)

        secret = o.password.get_secret_value() if o.password else None
        password = env(secret, "password", "OS_PASSWORD")
        username = env(o.username, "username", "OS_USERNAME")
        auth_url = env(o.auth_url, "auth_url", "OS_AUTH_URL")
        if not (username and password and auth_url):
            raise PermanentProviderError(
                f"configuration error: provider {self.name!r} needs auth_url, username and"
                " password (or OS_AUTH_URL, OS_USERNAME, OS_PASSWORD)"
            )
        kwargs: dict[str, Any] = {
            "ex_force_auth_url": auth_url,
            "ex_force_auth_version": "3.x_password",
            "ex_tenant_name": env(o.project_name, "project_name", "OS_PROJECT_NAME"),
            "ex_domain_name": env(o.domain_name, "user_domain_name", "OS_USER_DOMAIN_NAME")
            or "Default",
        }
        region = env(o.region, "region_name", "OS_REGION_NAME")
        if region:
            kwargs["ex_force_service_region"] = region
        return (username, password), kwargs

    def _cloud_entry(self) -> CloudEntry | None:
        name = cloud_name(self.options.cloud)
        return load_cloud(name, os.environ, self.name) if name else None

    def make_driver(self) -> Any:
        from libcloud.compute.providers import get_driver
        from libcloud.compute.types import Provider

        (username, password), kwargs = self.driver_args()
        return get_driver(Provider.OPENSTACK)(username, password, **kwargs)

    def launch(
        self, pool: str, template: str, name: str, tags: Mapping[str, str], size: str | None
    ) -> Node:
        from libcloud.compute.base import NodeImage, NodeSize
        from libcloud.compute.drivers.openstack import OpenStackNetwork

        o = self.options
        kwargs: dict[str, Any] = {"ex_metadata": dict(tags)}
        if o.network:
            kwargs["networks"] = [OpenStackNetwork(o.network, o.network, None, self.driver)]
        if o.key_name:
            kwargs["ex_keyname"] = o.key_name
        if o.security_groups:
            kwargs["ex_security_groups"] = [_Group(g) for g in o.security_groups]
        flavor = size or o.flavor
        node_size = NodeSize(flavor, flavor, 0, 0, 0, 0, self.driver)
        image = NodeImage(template, template, self.driver)
        return self.driver.create_node(name=name, size=node_size, image=image, **kwargs)

    def list_fleet(self) -> list[Node]:
        return list(self.driver.list_nodes())

    def tags_of(self, node: Node) -> Mapping[str, str]:
        return dict(node.extra.get("metadata") or {})


class _Group:
    """What libcloud reads of a security group in a create: its name."""

    def __init__(self, name: str) -> None:
        self.name = name
