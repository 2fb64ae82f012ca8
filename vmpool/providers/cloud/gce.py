"""Google Compute Engine through libcloud's GCE connection (auth, retries of the
transport, error parsing), with the few REST calls vmpool needs made directly:

- create: ``instances.insert`` with the labels in the body (no unlabelled window); the
  call returns at once (the operation is not awaited: the pending sweep sees the
  instance boot). Instance names are unique in a zone, so a second insert of the same
  VM answers 409 and the instance already there is returned: GCE's own idempotency.
- list: ``instances.list`` of the zone filtered by ``labels.vmpool-fleet`` (server
  side), one call.
- destroy: ``instances.delete``.

libcloud's ``create_node`` would look up the zone, machine type, network, image and disk
type first (five calls per create); these calls name them by URL instead.

Labels are lowercase letters, digits, ``-`` and ``_``, at most 63 characters: tag values
are folded to that (``label``), so two fleet ids differing only in case share a label.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from vmpool.providers.base import PermanentProviderError
from vmpool.providers.cloud.common import TAG_FLEET, CloudOptions, CloudProvider, Node

__all__ = ["GCEOptions", "GCEProvider", "driver_class"]

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


class GCEOptions(CloudOptions):
    """``provider_class: gce``. Credentials: a service-account key file
    (``credentials_file``, else GOOGLE_APPLICATION_CREDENTIALS), or the metadata
    server's tokens (``use_metadata_server``: GKE Workload Identity, a VM's service
    account)."""

    project: str = Field(description="The GCP project")
    zone: str = Field(description="The zone instances start in, e.g. us-central1-a")
    machine_type: str = Field("e2-small", description="The machine type")
    network: str = Field("default", description="The VPC network")
    subnetwork: str | None = Field(None, description="The subnetwork (region's)")
    external_ip: bool = Field(True, description="Give instances an ephemeral public address")
    credentials_file: str | None = Field(None, description="Service-account JSON key file")
    use_metadata_server: bool = Field(
        False,
        description="Take access tokens from the metadata server (GKE Workload Identity, or"
        " the VM's service account) instead of a key file",
    )


@dataclass
class GCENode:
    """The fields of an instance vmpool reads (libcloud's Node shape)."""

    id: str
    name: str
    state: str
    public_ips: list[str]
    private_ips: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


class GCEProvider(CloudProvider):
    options_model = GCEOptions
    provider_class = "gce"
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

    def _zone_path(self) -> str:
        return f"/zones/{self.options.zone}/instances"

    def insert_body(
        self, template: str, name: str, tags: Mapping[str, str], size: str | None = None
    ) -> dict[str, Any]:
        o = self.options
        image = template if "/" in template else f"projects/{o.project}/global/images/{template}"
        nic: dict[str, Any] = {"network": f"global/networks/{o.network}"}
        if o.subnetwork:
            region = o.zone.rsplit("-", 1)[0]
            nic["subnetwork"] = f"regions/{region}/subnetworks/{o.subnetwork}"
        if o.external_ip:
            nic["accessConfigs"] = [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]
        return {
            "name": name,
            "machineType": f"zones/{o.zone}/machineTypes/{size or o.machine_type}",
            "labels": dict(tags),
            "disks": [
                {"boot": True, "autoDelete": True, "initializeParams": {"sourceImage": image}}
            ],
            "networkInterfaces": [nic],
        }

    def launch(
        self, pool: str, template: str, name: str, tags: Mapping[str, str], size: str | None
    ) -> Node:
        body = self.insert_body(template, name, tags, size)
        try:
            self.driver.connection.request(self._zone_path(), method="POST", data=body)
        except Exception as exc:
            if getattr(exc, "http_code", None) != 409:
                raise
            # alreadyExists: an earlier insert of this VM went through; the caller's
            # next lookup finds it (and never a second instance: names are unique).
        return GCENode(name, name, "pending", [], [], {"labels": dict(tags)})

    def list_fleet(self) -> list[Node]:
        params = {"filter": f"labels.{TAG_FLEET}={self.label(self.fleet_id)}"}
        nodes: list[Node] = []
        while True:  # one page (up to 500 instances), unless GCE gives a nextPageToken
            reply = self.driver.connection.request(self._zone_path(), method="GET", params=params)
            page = reply.object or {}
            nodes += [_node(item) for item in page.get("items", [])]
            if not page.get("nextPageToken"):
                return nodes
            params = {**params, "pageToken": page["nextPageToken"]}

    def remove(self, node: Node) -> None:
        self.driver.connection.request(f"{self._zone_path()}/{node.name}", method="DELETE")

    def tags_of(self, node: Node) -> Mapping[str, str]:
        return dict(node.extra.get("labels") or {})


def _node(item: Mapping[str, Any]) -> GCENode:
    public: list[str] = []
    private: list[str] = []
    for nic in item.get("networkInterfaces", []):
        if nic.get("networkIP"):
            private.append(nic["networkIP"])
        public.extend(a["natIP"] for a in nic.get("accessConfigs", []) if a.get("natIP"))
    return GCENode(
        id=str(item.get("id", item["name"])),
        name=item["name"],
        state=_STATES.get(str(item.get("status", "")), "unknown"),
        public_ips=public,
        private_ips=private,
        extra={"labels": dict(item.get("labels") or {}), "image": ""},
    )


def driver_class() -> Any:
    """libcloud's GCE driver whose errors carry the response's headers, so that a
    ``Retry-After`` reaches the provider's backoff (libcloud's Google errors drop them)."""
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
