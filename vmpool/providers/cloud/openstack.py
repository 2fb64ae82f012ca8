"""OpenStack (Nova) through libcloud's OpenStack driver (Keystone v3 password auth).

Tags are server metadata given in the create call (``ex_metadata``: no untagged
window), with the pool's placement (flavor, availability zone, networks, key pair,
security groups, user data, config drive, a boot volume deleted with the server, the
newest image of a name). Nova lists servers without a metadata filter, so the fleet's
servers are picked from one ``GET /servers/detail`` by their ``vmpool-fleet`` metadata.
Nova has no idempotency token: a create is retried only after a lookup by tag found
nothing. A server in ERROR fails its VM at once, with Nova's fault message.
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Mapping
from typing import Any

from vmpool.providers.base import PermanentProviderError
from vmpool.providers.cloud.clouds_yaml import CloudEntry, cloud_name, load_cloud
from vmpool.providers.cloud.common import CloudProvider
from vmpool.providers.cloud.nodes import Node, node_state
from vmpool.providers.cloud.openstack_options import OpenStackOptions, OpenStackPoolOptions

__all__ = ["OpenStackOptions", "OpenStackPoolOptions", "OpenStackProvider"]

# How long the newest image of a pool's image_name is reused before it is looked up again.
IMAGE_NAME_TTL_S = 600.0


class OpenStackProvider(CloudProvider):
    options_model = OpenStackOptions
    pool_model = OpenStackPoolOptions
    provider_class = "openstack"
    size_key = "flavor"
    options: OpenStackOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._images: dict[str, tuple[float, str]] = {}

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

    def launch(self, pool: str, template: str, name: str, tags: Mapping[str, str]) -> Node:
        from libcloud.compute.base import NodeImage, NodeSize
        from libcloud.compute.drivers.openstack import OpenStackNetwork

        s = partial_setting(self, pool)
        kwargs: dict[str, Any] = {"ex_metadata": {**self.user_tags(pool), **tags}}
        networks = s("network")
        if networks:
            ids = [networks] if isinstance(networks, str) else list(networks)
            kwargs["networks"] = [OpenStackNetwork(i, i, None, self.driver) for i in ids]
        optional = {
            "ex_keyname": s("key_name"),
            "ex_userdata": s("user_data"),
            "ex_config_drive": s("config_drive"),
            "ex_availability_zone": s("availability_zone"),
        }
        kwargs.update({k: v for k, v in optional.items() if v})
        if s("security_groups"):
            kwargs["ex_security_groups"] = [_Group(g) for g in s("security_groups")]
        image_id = self.image_id(pool, template)
        image: Any = NodeImage(image_id, image_id, self.driver)
        if s("volume_size"):  # boot from a new volume, deleted with the server
            volume = {
                "boot_index": 0,
                "uuid": image_id,
                "source_type": "image",
                "destination_type": "volume",
                "volume_size": s("volume_size"),
                "delete_on_termination": True,
            }
            if s("volume_type"):
                volume["volume_type"] = s("volume_type")
            kwargs["ex_blockdevicemappings"] = [volume]
            image = None
        flavor = s("flavor")
        node_size = NodeSize(flavor, flavor, 0, 0, 0, 0, self.driver)
        return self.driver.create_node(name=name, size=node_size, image=image, **kwargs)

    def image_id(self, pool: str, template: str) -> str:
        """The newest image of the pool's ``image_name``, else the template (an image id).

        The name is looked up again after IMAGE_NAME_TTL_S."""
        pattern = self.setting(pool, "image_name")
        if not pattern:
            return template
        cached = self._images.get(pattern)
        if cached and cached[0] > time.monotonic():
            return cached[1]
        images = self._call("image", self._list_images)
        matching = [i for i in images if fnmatch.fnmatchcase(str(i.get("name", "")), pattern)]
        if not matching:
            raise PermanentProviderError(f"no image named {pattern!r} (image_name)")
        newest = max(matching, key=lambda i: str(i.get("created") or ""))
        self._images[pattern] = (time.monotonic() + IMAGE_NAME_TTL_S, str(newest["id"]))
        return str(newest["id"])

    def _list_images(self) -> list[Mapping[str, Any]]:
        """The active images, through Nova's image list.

        One call, the compute endpoint's: no Glance endpoint to find."""
        reply = self.driver.connection.request("/images/detail").object or {}
        return [i for i in reply.get("images", []) if i.get("status", "ACTIVE") == "ACTIVE"]

    def list_fleet(self, marks: tuple[str, ...] = ()) -> list[Node]:
        """Every server (Nova filters no metadata: the caller picks the marked ones)."""
        return list(self.driver.list_nodes())

    def size_cores(self, pool: str, size: str) -> int:
        """The flavor's vcpus (GET /flavors/<id>)."""
        reply = self._call("size", lambda: self.driver.connection.request(f"/flavors/{size}"))
        return int(reply.object["flavor"]["vcpus"])

    def tags_of(self, node: Node) -> Mapping[str, str]:
        return dict(node.extra.get("metadata") or {})

    def failure(self, node: Node) -> str:
        """A server in ERROR (or shut off while booting) never turns ready: Nova's fault."""
        state = node_state(node)
        if state not in ("error", "stopped"):
            return ""
        fault = node.extra.get("fault") or {}
        message = fault.get("message", "") if isinstance(fault, Mapping) else str(fault)
        status = "ERROR" if state == "error" else "SHUTOFF"
        return f"server {node.id} {status}" + (f": {message}" if message else "")


def partial_setting(provider: OpenStackProvider, pool: str) -> Any:
    """``provider.setting`` for one pool, as a one-argument function."""
    return lambda key: provider.setting(pool, key)


class _Group:
    """What libcloud reads of a security group in a create: its name."""

    def __init__(self, name: str) -> None:
        self.name = name
