"""Google Compute Engine through libcloud's GCE connection.

libcloud gives the auth, the transport's retries and the error parsing. The few REST
calls vmpool needs are made directly:

- create: ``instances.insert`` in the pool's zone, with the labels in the body (the
  instance and its boot disk: no unlabelled window), the pool's machine type, network,
  disk, image (or image family), service account, metadata (user-data, ssh-keys) and
  scheduling (spot). Then the insert operation is followed (``zoneOperations.get``,
  backing off, for ``operation_wait`` seconds at most) to its result, so the cloud's
  answer reaches the create: ``QUOTA_EXCEEDED`` and ``ZONE_RESOURCE_POOL_EXHAUSTED``
  as quota (the VM waits), a bad image or machine type as a permanent error, in GCE's
  words. Instance names are unique in a zone, so a second insert of the same VM
  answers 409 and the instance already there is returned: GCE's own idempotency.
- list: ``instances.aggregatedList`` filtered by ``labels.vmpool-fleet`` (server side),
  one call for every zone the pools use.
- destroy: ``instances.delete`` in the instance's zone.

libcloud's ``create_node`` would look up the zone, machine type, network, image and disk
type first (five calls per create). These calls name them by URL instead.

Labels are lowercase letters, digits, ``-`` and ``_``, at most 63 characters: tag keys
and values are folded to that (``label``), so two fleet ids differing only in case
share a label.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from vmpool.providers.base import PermanentProviderError
from vmpool.providers.cloud.common import TAG_FLEET, CloudProvider
from vmpool.providers.cloud.gce_options import GCEOptions, GCEPoolOptions
from vmpool.providers.cloud.nodes import Node

__all__ = ["GCEOptions", "GCEPoolOptions", "GCEProvider", "driver_class"]

log = logging.getLogger(__name__)

# GCE instance status -> the state names the rest of vmpool reads.
_STATES = {
    "PROVISIONING": "pending",
    "STAGING": "pending",
    "RUNNING": "running",
    "STOPPING": "stopping",
    "SUSPENDING": "stopping",
    "SUSPENDED": "stopped",
    "TERMINATED": "stopped",  # GCE's TERMINATED is a stopped instance, still there
}
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


@dataclass
class GCENode:
    """The fields of an instance vmpool reads (libcloud's Node shape)."""

    id: str
    name: str
    state: str
    public_ips: list[str]
    private_ips: list[str]
    extra: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None


class GCEProvider(CloudProvider):
    options_model = GCEOptions
    pool_model = GCEPoolOptions
    provider_class = "gce"
    size_key = "machine_type"
    options: GCEOptions

    def label(self, value: str) -> str:
        return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]

    def make_driver(self) -> Any:
        if self.options.use_metadata_server:
            # libcloud's GCE auth type: tokens from the metadata server, refreshed by it.
            return driver_class()("", "", project=self.options.project, auth_type="GCE")
        path = self.options.credentials_file or os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if not path:
            raise PermanentProviderError(
                f"configuration error: provider {self.name!r} has no credentials_file"
                " (or GOOGLE_APPLICATION_CREDENTIALS; use_metadata_server: true for GKE"
                " Workload Identity)"
            )
        try:
            with open(path, encoding="utf-8") as handle:
                email = json.load(handle)["client_email"]
        except (OSError, ValueError, KeyError) as exc:
            raise PermanentProviderError(
                f"configuration error: provider {self.name!r}: cannot read the service"
                f" account key file ({type(exc).__name__})"
            ) from None
        return driver_class()(email, path, project=self.options.project, auth_type="SA")

    def insert_body(self, pool: str, template: str, name: str, tags: Mapping[str, str]) -> Any:
        """The instances.insert body of VM ``name`` of ``pool`` (tests read it)."""
        zone = self.setting(pool, "zone")
        labels = {self.label(k): self.label(v) for k, v in self.user_tags(pool).items()}
        labels.update(tags)
        disk: dict[str, Any] = {"sourceImage": self.source_image(pool, template), "labels": labels}
        if self.setting(pool, "disk_type"):
            disk["diskType"] = f"zones/{zone}/diskTypes/{self.setting(pool, 'disk_type')}"
        if self.setting(pool, "disk_size"):
            disk["diskSizeGb"] = str(self.setting(pool, "disk_size"))
        body: dict[str, Any] = {
            "name": name,
            "machineType": f"zones/{zone}/machineTypes/{self.setting(pool, 'machine_type')}",
            "labels": labels,
            "disks": [{"boot": True, "autoDelete": True, "initializeParams": disk}],
            "networkInterfaces": [self._nic(pool, zone)],
        }
        metadata = self._metadata(pool)
        if metadata:
            body["metadata"] = {"items": [{"key": k, "value": v} for k, v in metadata.items()]}
        if self.setting(pool, "service_account"):
            scopes = self.setting(pool, "scopes") or SCOPES
            body["serviceAccounts"] = [
                {"email": self.setting(pool, "service_account"), "scopes": scopes}
            ]
        if self.setting(pool, "spot"):
            body["scheduling"] = {
                "provisioningModel": "SPOT",
                "instanceTerminationAction": "DELETE",
            }
        return body

    def source_image(self, pool: str, template: str) -> str:
        """The pool's image family (GCE starts from its newest image), else its template.

        The template is a path, or an image name in the provider's project."""
        family = self.setting(pool, "image_family")
        if family:
            project = self.setting(pool, "image_project") or self.options.project
            return f"projects/{project}/global/images/family/{family}"
        if "/" in template:
            return template
        return f"projects/{self.options.project}/global/images/{template}"

    def _nic(self, pool: str, zone: str) -> dict[str, Any]:
        nic: dict[str, Any] = {"network": f"global/networks/{self.setting(pool, 'network')}"}
        subnetwork = self.setting(pool, "subnetwork")
        if subnetwork:
            region = zone.rsplit("-", 1)[0]
            nic["subnetwork"] = f"regions/{region}/subnetworks/{subnetwork}"
        if self.setting(pool, "external_ip"):
            nic["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
        return nic

    def _metadata(self, pool: str) -> dict[str, str]:
        items = dict(self.setting(pool, "metadata") or {})
        if self.setting(pool, "user_data"):
            items["user-data"] = self.setting(pool, "user_data")
        if self.setting(pool, "ssh_keys"):
            items["ssh-keys"] = "\n".join(self.setting(pool, "ssh_keys"))
        return items

    def launch(self, pool: str, template: str, name: str, tags: Mapping[str, str]) -> Node:
        zone = self.setting(pool, "zone")
        body = self.insert_body(pool, template, name, tags)
        try:
            reply = self.driver.connection.request(
                f"/zones/{zone}/instances", method="POST", data=body
            )
        except Exception as exc:
            if getattr(exc, "http_code", None) != 409:
                raise
            # alreadyExists: an earlier insert of this VM went through. The caller's
            # next lookup finds it (and never a second instance: names are unique).
        else:
            self.follow(zone, reply.object or {})
        return GCENode(name, name, "pending", [], [], {"labels": dict(tags), "zone": zone})

    def follow(self, zone: str, operation: Mapping[str, Any]) -> None:
        """Follow an insert operation to its result, for ``operation_wait`` seconds at most.

        An error in it is raised (libcloud's parser raises it, with GCE's code), so quota
        and bad requests reach the create in GCE's words."""
        deadline = time.monotonic() + self.options.operation_wait
        delay = 0.5
        while operation.get("status") != "DONE" and operation.get("name"):
            path = f"/zones/{zone}/operations/{operation['name']}"
            operation = self._call("operation", partial(self._get, path)) or {}
            left = deadline - time.monotonic()
            if operation.get("status") == "DONE":
                return
            if left <= 0:
                log.info(
                    "%s: insert %s still running; the pending checks take over",
                    self.name,
                    operation.get("name"),
                )
                return
            self.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)

    def _get(self, path: str) -> Any:
        return self.driver.connection.request(path, method="GET").object

    def list_fleet(self, marks: tuple[str, ...]) -> list[Node]:
        """One aggregated list (per page), filtered by the fleet label's values ``marks``."""
        terms = [f"labels.{TAG_FLEET}={self.label(mark)}" for mark in marks]
        params = {
            "filter": terms[0] if len(terms) == 1 else " OR ".join(f"({t})" for t in terms),
            "returnPartialSuccess": "true",
        }
        nodes: list[Node] = []
        while True:  # one page (up to 500 instances), unless GCE gives a nextPageToken
            reply = self.driver.connection.request(
                "/aggregated/instances", method="GET", params=params
            )
            page = reply.object or {}
            for scope in (page.get("items") or {}).values():
                nodes += [_node(item) for item in scope.get("instances", [])]
            if not page.get("nextPageToken"):
                return nodes
            params = {**params, "pageToken": page["nextPageToken"]}

    def remove(self, node: Node) -> None:
        zone = node.extra.get("zone") or self.options.zone
        self.driver.connection.request(f"/zones/{zone}/instances/{node.name}", method="DELETE")

    def size_cores(self, pool: str, size: str) -> int:
        """machineTypes.get in the pool's zone: its guestCpus."""
        path = f"/zones/{self.setting(pool, 'zone')}/machineTypes/{size}"
        return int((self._call("size", partial(self._get, path)) or {})["guestCpus"])

    def tags_of(self, node: Node) -> Mapping[str, str]:
        return dict(node.extra.get("labels") or {})

    def failure(self, node: Node) -> str:
        """A stopped or suspended instance never turns ready by itself: GCE's words."""
        if node.state not in ("stopped", "stopping"):
            return ""
        status = node.extra.get("status", node.state)
        message = node.extra.get("status_message") or ""
        return f"instance {node.name} {status}" + (f": {message}" if message else "")


def _node(item: Mapping[str, Any]) -> GCENode:
    public: list[str] = []
    private: list[str] = []
    for nic in item.get("networkInterfaces", []):
        if nic.get("networkIP"):
            private.append(nic["networkIP"])
        public.extend(a["natIP"] for a in nic.get("accessConfigs", []) if a.get("natIP"))
    status = str(item.get("status", ""))
    return GCENode(
        id=str(item.get("id", item["name"])),
        name=item["name"],
        state=_STATES.get(status, "unknown"),
        public_ips=public,
        private_ips=private,
        extra={
            "labels": dict(item.get("labels") or {}),
            "image": "",
            "zone": str(item.get("zone", "")).rsplit("/", 1)[-1],
            "status": status,
            "status_message": item.get("statusMessage", ""),
        },
        created_at=_timestamp(item.get("creationTimestamp")),
    )


def _timestamp(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def driver_class() -> Any:
    """libcloud's GCE driver, whose errors carry the response's headers.

    So a ``Retry-After`` reaches the provider's backoff (libcloud's Google errors drop the
    headers)."""
    from libcloud.common.google import GoogleBaseError
    from libcloud.compute.drivers.gce import GCEConnection, GCENodeDriver, GCEResponse

    class HeaderedResponse(GCEResponse):  # type: ignore[misc]
        def parse_body(self) -> Any:
            try:
                return super().parse_body()
            except GoogleBaseError as exc:
                exc.headers = dict(self.headers or {})
                raise

    class HeaderedConnection(GCEConnection):  # type: ignore[misc]
        responseCls = HeaderedResponse

    class HeaderedGCEDriver(GCENodeDriver):  # type: ignore[misc]
        connectionCls = HeaderedConnection

    return HeaderedGCEDriver
