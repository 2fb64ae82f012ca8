"""In-memory EC2, GCE and OpenStack APIs behind libcloud's MockHttp (tests only).

Each fake keeps the instances a test made, answers the few calls vmpool's providers
make (create with tags, list filtered by the fleet tag, get, destroy) in the cloud's
own wire format, and can be told to fail the next calls of one kind (``fail``) with a
status, body and headers, to test throttling and permanent errors. A created instance
is 'pending' until the first list after its create, then 'running', with an address
of its own on loopback: ``127.0.0.1`` for the first (so an ssh ready check can be
pointed at a local listening socket), ``127.0.0.2`` for the second, and so on.

``install(monkeypatch, kind)`` points libcloud's driver connection at the fake and
returns ``(fake, driver)``: build the provider with ``driver=driver``.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from libcloud.test import MockHttp

Reply = tuple[int, str, dict[str, str], str]

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"


@dataclass
class Instance:
    id: str
    name: str
    image: str
    size: str
    tags: dict[str, str]
    state: str = "pending"
    listed: int = 0
    address: str = "127.0.0.1"
    params: dict[str, Any] = field(default_factory=dict)  # the create call, as sent
    zone: str = ""
    fault: str = ""  # the cloud's words for a failed (ERROR, stopped) instance


@dataclass
class FakeCloud:
    """The cloud's state; ``calls`` counts API calls by kind (create, list, get, destroy)."""

    instances: dict[str, Instance] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    failures: dict[str, list[Reply]] = field(default_factory=dict)
    ids: Any = field(default_factory=lambda: itertools.count(1))
    missing_images: set[str] = field(default_factory=set)
    lost_answers: int = 0  # creates that succeed but whose answer is a 503
    page_size: int | None = None  # lists answer in pages of this many (EC2, GCE)
    # images by name for lookups by filter or name: (id, name, created)
    images: list[tuple[str, str, str]] = field(default_factory=list)
    # GCE: insert operations that end in an error (code, message), one per insert
    operation_errors: list[tuple[str, str]] = field(default_factory=list)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)

    def page(self, found: list[Any], token: str | None) -> tuple[list[Any], str | None]:
        """One page of ``found`` from ``token`` (an offset), and the next token."""
        start = int(token or 0)
        if self.page_size is None:
            return found[start:], None
        end = start + self.page_size
        return found[start:end], (str(end) if end < len(found) else None)

    def answer(self, reply: Reply, lost: Reply) -> Reply:
        """``reply``, or ``lost`` while answers are to be lost (the create went through)."""
        if self.lost_answers > 0:
            self.lost_answers -= 1
            return lost
        return reply

    def fail(
        self,
        kind: str,
        status: int,
        body: str,
        headers: dict[str, str] | None = None,
        times: int = 1,
    ) -> None:
        self.failures.setdefault(kind, []).extend([(status, body, headers or {}, "error")] * times)

    def take_failure(self, kind: str) -> Reply | None:
        self.calls[kind] += 1
        queue = self.failures.get(kind)
        return queue.pop(0) if queue else None

    def create(self, name: str, image: str, size: str, tags: dict[str, str]) -> Instance:
        n = next(self.ids)
        instance = Instance(
            f"i-{n:08x}",
            name,
            image,
            size,
            dict(tags),
            address=f"127.0.{(n - 1) // 254}.{(n - 1) % 254 + 1}",
        )
        self.instances[instance.id] = instance
        return instance

    def live(self) -> list[Instance]:
        found = [i for i in self.instances.values() if i.state != "terminated"]
        for instance in found:
            instance.listed += 1
            if instance.listed > 1 and instance.state == "pending":
                instance.state = "running"
        return found

    def by_name(self, name: str) -> Instance | None:
        return next((i for i in self.live() if i.name == name), None)


def _ok(body: Any, status: int = 200) -> Reply:
    text = body if isinstance(body, str) else json.dumps(body)
    return status, text, {"content-type": "application/json"}, "OK"


# -- EC2 -----------------------------------------------------------------------------------


def _ec2_item(i: Instance) -> str:
    tags = "".join(f"<item><key>{k}</key><value>{v}</value></item>" for k, v in i.tags.items())
    code = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48,
            "stopping": 64, "stopped": 80}[i.state]  # fmt: skip
    reason = ""
    if i.fault:
        code_, _, message = i.fault.partition(": ")
        reason = (f"<stateReason><code>{code_}</code><message>{message}</message>"
                  "</stateReason>")  # fmt: skip
    return (
        f"<item><instanceId>{i.id}</instanceId><imageId>{i.image}</imageId>"
        f"<instanceState><code>{code}</code><name>{i.state}</name></instanceState>{reason}"
        f"<privateDnsName/><dnsName/><instanceType>{i.size}</instanceType>"
        "<launchTime>2026-01-01T00:00:00.000Z</launchTime>"
        f"<privateIpAddress>10.0.0.9</privateIpAddress><ipAddress>{i.address}</ipAddress>"
        f"<tagSet>{tags}</tagSet></item>"
    )


def ec2_error(code: str, message: str, xmlns: str = "") -> str:
    """An EC2 error body: EC2's own shape (no namespace), or with ``xmlns`` on the
    root as moto and other EC2-compatible endpoints write it."""
    ns = f' xmlns="{xmlns}"' if xmlns else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Response{ns}><Errors><Error>'
        f"<Code>{code}</Code><Message>{message}</Message>"
        "</Error></Errors><RequestID>req-1</RequestID></Response>"
    )


def _ec2_image(image_id: str, created: str = "2026-01-01T00:00:00.000Z") -> str:
    return (
        f"<item><imageId>{image_id}</imageId><creationDate>{created}</creationDate>"
        "<rootDeviceName>/dev/xvda</rootDeviceName><blockDeviceMapping>"
        "<item><deviceName>/dev/xvda</deviceName><ebs><snapshotId>snap-1</snapshotId>"
        "<volumeSize>8</volumeSize></ebs></item>"
        "<item><deviceName>/dev/sdb</deviceName><virtualName>ephemeral0</virtualName></item>"
        "</blockDeviceMapping></item>"
    )


class EC2Mock(MockHttp):  # type: ignore[misc]
    cloud: FakeCloud

    def _get_request(self, method: str, url: str, body: Any = None, headers: Any = None) -> Reply:
        query = parse_qs(urlparse(url).query, keep_blank_values=True)
        params = {k: v[0] for k, v in query.items()}
        if body:
            params.update({k: v[0] for k, v in parse_qs(str(body), keep_blank_values=True).items()})
        action = params.get("Action", "")
        kind = {
            "RunInstances": "create",
            "DescribeInstances": "list",
            "TerminateInstances": "destroy",
            "DescribeImages": "image",
        }.get(action, action)
        failure = self.cloud.take_failure(kind)
        if failure:
            return failure
        return getattr(self, f"_ec2_{kind}")(params)

    def _ec2_image(self, params: dict[str, str]) -> Reply:
        wanted = params.get("ImageId.1")
        if wanted in self.cloud.missing_images:
            body = ec2_error(
                "InvalidAMIID.NotFound",
                f"The image id '[{wanted}]' does not exist",
                xmlns=EC2_NS.rstrip("/"),
            )  # moto's shape: namespaced
            return 400, body, {}, "Bad Request"
        if wanted:
            items = _ec2_image(wanted)
        else:
            names = {v for k, v in params.items() if k.startswith("Filter.1.Value.")}
            items = "".join(
                _ec2_image(i, created)
                for i, name, created in self.cloud.images
                if any(fnmatch.fnmatchcase(name, n) for n in names)
            )
        return _ok(
            f'<DescribeImagesResponse xmlns="{EC2_NS}"><imagesSet>{items}</imagesSet>'
            "</DescribeImagesResponse>"
        )

    def _ec2_create(self, params: dict[str, str]) -> Reply:
        image = params["ImageId"]
        if image in self.cloud.missing_images:
            return (
                400,
                ec2_error("InvalidAMIID.NotFound", f"The image id '[{image}]' does not exist"),
                {},
                "Bad Request",
            )
        tags = {}
        for n in itertools.count(1):
            key = params.get(f"TagSpecification.1.Tag.{n}.Key")
            if key is None:
                break
            tags[key] = params.get(f"TagSpecification.1.Tag.{n}.Value", "")
        instance = self.cloud.create(tags.get("Name", ""), image, params["InstanceType"], tags)
        instance.params = dict(params)
        instance.zone = params.get("Placement.AvailabilityZone", "")
        lost = (503, ec2_error("Unavailable", "The server is unavailable"), {}, "Unavailable")
        return self.cloud.answer(
            _ok(
                f'<RunInstancesResponse xmlns="{EC2_NS}"><reservationId>r-1</reservationId>'
                f"<ownerId>1</ownerId><groupSet/><instancesSet>{_ec2_item(instance)}"
                "</instancesSet></RunInstancesResponse>"
            ),
            lost,
        )

    def _ec2_list(self, params: dict[str, str]) -> Reply:
        filters: dict[str, set[str]] = {}
        for n in itertools.count(1):
            name = params.get(f"Filter.{n}.Name")
            if name is None:
                break
            values = {v for k, v in params.items() if k.startswith(f"Filter.{n}.Value.")}
            filters[name] = values
        found = []
        for i in self.cloud.live():
            tagged = all(i.tags.get(f[4:]) in v for f, v in filters.items() if f[:4] == "tag:")
            if tagged and i.state in filters.get("instance-state-name", {i.state}):
                found.append(i)
        page, token = self.cloud.page(found, params.get("NextToken"))
        items = "".join(_ec2_item(i) for i in page)
        more = f"<nextToken>{token}</nextToken>" if token else ""
        return _ok(
            f'<DescribeInstancesResponse xmlns="{EC2_NS}"><reservationSet><item>'
            "<reservationId>r-1</reservationId><ownerId>1</ownerId><groupSet/>"
            f"<instancesSet>{items}</instancesSet></item></reservationSet>{more}"
            "</DescribeInstancesResponse>"
        )

    def _ec2_destroy(self, params: dict[str, str]) -> Reply:
        instance = self.cloud.instances[params["InstanceId.1"]]
        instance.state = "terminated"
        return _ok(
            f'<TerminateInstancesResponse xmlns="{EC2_NS}"><instancesSet><item>'
            f"<instanceId>{instance.id}</instanceId><currentState><code>32</code>"
            "<name>shutting-down</name></currentState><previousState><code>16</code>"
            "<name>running</name></previousState></item></instancesSet>"
            "</TerminateInstancesResponse>"
        )


# -- GCE -----------------------------------------------------------------------------------


def gce_error(status: int, reason: str, message: str) -> str:
    return json.dumps(
        {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"reason": reason, "message": message, "domain": "global"}],
            }
        }
    )


def _gce_item(i: Instance) -> dict[str, Any]:
    status = {"pending": "PROVISIONING", "running": "RUNNING", "stopped": "TERMINATED"}.get(
        i.state, "STOPPING"
    )
    return {
        "id": i.id,
        "name": i.name,
        "status": status,
        "labels": i.tags,
        "zone": f"https://www.googleapis.com/compute/v1/projects/proj/zones/{i.zone}",
        "statusMessage": i.fault,
        "creationTimestamp": "2026-01-01T00:00:00.000-07:00",
        "networkInterfaces": [{"networkIP": "10.0.0.9", "accessConfigs": [{"natIP": i.address}]}],
    }


class GCEMock(MockHttp):  # type: ignore[misc]
    """instances.insert (answering a zone operation, followed with zoneOperations.get:
    DONE at the first get, with an error when ``operation_errors`` says so: GCE's
    shape), instances.aggregatedList filtered by a label, instances.delete."""

    cloud: FakeCloud

    def _get_request(self, method: str, url: str, body: Any = None, headers: Any = None) -> Reply:
        parsed = urlparse(url)
        path = parsed.path.rstrip("/").split("/projects/proj", 1)[1]
        parts = path.strip("/").split("/")
        if parts[:2] == ["aggregated", "instances"] and method == "GET":
            return self.take("list") or self._list(parse_qs(parsed.query))
        if len(parts) >= 3 and parts[0] == "zones" and parts[2] == "operations":
            self.cloud.calls["operation"] += 1
            return self._operation(parts[3])
        if len(parts) >= 3 and parts[0] == "zones" and parts[2] == "instances":
            zone = parts[1]
            if method == "POST":
                return self.take("create") or self._insert(zone, json.loads(body))
            if method == "DELETE":
                return self.take("destroy") or self._delete(parts[3])
        return 404, gce_error(404, "notFound", f"no such path {path}"), {}, "Not Found"

    def take(self, kind: str) -> Reply | None:
        return self.cloud.take_failure(kind)

    def _list(self, query: dict[str, list[str]]) -> Reply:
        # labels.K=V, or (labels.K=V1) OR (labels.K=V2) ...: one of them
        terms = re.findall(r"labels\.([\w.-]+)=([^)\s]+)", query.get("filter", [""])[0])
        found = [i for i in self.cloud.live() if any(i.tags.get(k) == v for k, v in terms)]
        page, token = self.cloud.page(found, query.get("pageToken", [None])[0])
        items: dict[str, Any] = {"zones/us-east1-b": {"warning": {"code": "NO_RESULTS_ON_PAGE"}}}
        for i in page:
            items.setdefault(f"zones/{i.zone}", {"instances": []})["instances"].append(_gce_item(i))
        reply: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "items": items}
        if token:
            reply["nextPageToken"] = token
        return _ok(reply)

    def _delete(self, name: str) -> Reply:
        found = self.cloud.by_name(name)
        if found is None:
            return 404, gce_error(404, "notFound", "instance not found"), {}, "Not Found"
        found.state = "terminated"
        return _ok({"kind": "compute#operation", "name": "op-delete", "status": "PENDING"})

    def _operation(self, name: str) -> Reply:
        op = self.cloud.operations[name]
        reply: dict[str, Any] = {"kind": "compute#operation", "name": name, "status": "DONE"}
        if op.get("error"):
            code, message = op["error"]
            reply["error"] = {"errors": [{"code": code, "message": message}]}
            reply["httpErrorStatusCode"] = 403 if code == "QUOTA_EXCEEDED" else 400
        return _ok(reply)

    def _insert(self, zone: str, body: dict[str, Any]) -> Reply:
        image = body["disks"][0]["initializeParams"]["sourceImage"]
        if image.rsplit("/", 1)[-1] in self.cloud.missing_images:
            message = f"The resource '{image}' was not found"
            return 404, gce_error(404, "notFound", message), {}, "Not Found"
        if self.cloud.by_name(body["name"]) is not None:
            message = f"The resource '{body['name']}' already exists"
            return 409, gce_error(409, "alreadyExists", message), {}, "Conflict"
        name = f"op-{len(self.cloud.operations) + 1}"
        if self.cloud.operation_errors:
            self.cloud.operations[name] = {"error": self.cloud.operation_errors.pop(0)}
            return _ok({"kind": "compute#operation", "name": name, "status": "RUNNING"})
        size = body["machineType"].rsplit("/", 1)[-1]
        instance = self.cloud.create(body["name"], image, size, body.get("labels", {}))
        instance.params, instance.zone = body, zone
        self.cloud.operations[name] = {}
        lost = (503, gce_error(503, "backendError", "Backend Error"), {}, "Unavailable")
        op = _ok({"kind": "compute#operation", "name": name, "status": "RUNNING"})
        return self.cloud.answer(op, lost)


# -- OpenStack -----------------------------------------------------------------------------

OPENSTACK_BASE = "http://127.0.0.1:8774/v2.1/tenant"


def _os_server(i: Instance) -> dict[str, Any]:
    status = {"pending": "BUILD", "running": "ACTIVE", "error": "ERROR",
              "stopped": "SHUTOFF"}.get(i.state, "DELETED")  # fmt: skip
    fault = {"fault": {"code": 500, "message": i.fault, "created": "2026-01-01T00:00:00Z"}}
    return {
        **(fault if i.fault else {}),
        "id": i.id,
        "name": i.name,
        "status": status,
        "metadata": i.tags,
        "addresses": {"net": [{"addr": i.address, "version": 4, "OS-EXT-IPS:type": "floating"}]},
        "image": {"id": i.image},
        "flavor": {"id": i.size},
        "tenant_id": "tenant",
        "user_id": "u",
        "created": "2026-01-01T00:00:00Z",
        "updated": "2026-01-01T00:00:00Z",
        "hostId": "h",
        "key_name": None,
        "accessIPv4": "",
        "accessIPv6": "",
        "links": [{"rel": "self", "href": f"{OPENSTACK_BASE}/servers/{i.id}"}],
    }


class OpenStackMock(MockHttp):  # type: ignore[misc]
    cloud: FakeCloud

    def _get_request(self, method: str, url: str, body: Any = None, headers: Any = None) -> Reply:
        path = urlparse(url).path.rstrip("/").split("/tenant", 1)[1]
        if method == "POST" and path == "/servers":
            return self._failure("create") or self._create(json.loads(body)["server"])
        if method == "GET" and path == "/images/detail":
            self.cloud.calls["image"] += 1
            return _ok(
                {
                    "images": [
                        {"id": i, "name": n, "created": c, "status": "ACTIVE"}
                        for i, n, c in self.cloud.images
                    ]
                }
            )
        if method == "GET" and path == "/servers/detail":
            return self._failure("list") or _ok(
                {"servers": [_os_server(i) for i in self.cloud.live()]}
            )
        server_id = path.rsplit("/", 1)[-1]
        instance = self.cloud.instances.get(server_id)
        if method == "DELETE":
            failure = self._failure("destroy")
            if failure:
                return failure
            if instance is not None:
                instance.state = "terminated"
            return 204, "", {}, "No Content"
        self.cloud.calls["get"] += 1
        if instance is None:
            return 404, json.dumps({"itemNotFound": {"message": "nope", "code": 404}}), {}, "NF"
        return _ok({"server": _os_server(instance)})

    def _failure(self, kind: str) -> Reply | None:
        return self.cloud.take_failure(kind)

    def _create(self, server: dict[str, Any]) -> Reply:
        image = server.get("imageRef", "")
        if image in self.cloud.missing_images:
            body = {"badRequest": {"message": f"Image {image} could not be found.", "code": 400}}
            return 400, json.dumps(body), {"content-type": "application/json"}, "Bad Request"
        instance = self.cloud.create(
            server["name"], image, server.get("flavorRef", ""), server.get("metadata", {})
        )
        instance.params = dict(server)
        instance.zone = server.get("availability_zone", "")
        lost = (503, json.dumps({"computeFault": {"message": "down", "code": 503}}), {}, "down")
        return self.cloud.answer(_ok({"server": {"id": instance.id, "adminPass": "x"}}, 202), lost)


# -- wiring --------------------------------------------------------------------------------


def install(monkeypatch: pytest.MonkeyPatch, kind: str) -> tuple[FakeCloud, Any]:
    """Point libcloud's ``kind`` driver at a new fake; the fake and a driver for it."""
    cloud = FakeCloud()
    if kind == "ec2":
        from libcloud.compute.drivers.ec2 import EC2NodeDriver

        from vmpool.providers.cloud.ec2_wire import driver_class as ec2_driver

        monkeypatch.setattr(EC2Mock, "cloud", cloud, raising=False)
        monkeypatch.setattr(EC2NodeDriver.connectionCls, "conn_class", EC2Mock)
        return cloud, ec2_driver(tolerant=False)(
            "AKIDFAKE", "fake-secret", region="us-east-1", signature_version="4"
        )
    if kind == "gce":
        from libcloud.common import google
        from libcloud.compute.drivers.gce import GCENodeDriver

        from vmpool.providers.cloud.gce import driver_class

        token = {
            "access_token": "t",
            "token_type": "Bearer",
            "expire_time": "2099-01-01T00:00:00Z",
            "expires_in": 3600,
        }
        monkeypatch.setattr(
            google.GoogleOAuth2Credential, "_get_token_from_file", lambda self: token
        )
        monkeypatch.setattr(
            google.GoogleOAuth2Credential, "_write_token_to_file", lambda self: None
        )
        monkeypatch.setattr(google.GoogleAuthType, "_is_gce", staticmethod(lambda: False))
        monkeypatch.setattr(GCEMock, "cloud", cloud, raising=False)
        monkeypatch.setattr(GCENodeDriver.connectionCls, "conn_class", GCEMock)
        return cloud, driver_class()(
            "sa@example.iam.gserviceaccount.com", "key", project="proj", auth_type="IA"
        )
    from libcloud.compute.drivers.openstack import OpenStack_2_NodeDriver

    monkeypatch.setattr(OpenStackMock, "cloud", cloud, raising=False)
    monkeypatch.setattr(OpenStack_2_NodeDriver.connectionCls, "conn_class", OpenStackMock)
    driver = OpenStack_2_NodeDriver(
        "user",
        "password",
        ex_force_auth_token="token",
        ex_force_base_url=OPENSTACK_BASE,
        ex_force_auth_url="http://127.0.0.1:5000",
        ex_force_auth_version="3.x_password",
        ex_tenant_name="tenant",
        ex_domain_name="Default",
    )
    return cloud, driver
