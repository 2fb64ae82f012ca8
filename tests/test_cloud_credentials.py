"""Cloud credentials as a Kubernetes pod gets them: IRSA and EKS Pod Identity (EC2),
the metadata server (GKE Workload Identity), a mounted clouds.yaml (OpenStack).

IRSA runs for real against moto's STS and EC2 (the session's moto server): the
provider has no keys, only the web identity EKS would inject, and creates an instance.
EKS Pod Identity's agent and GKE's metadata server cannot run here: each is a small
HTTP server on loopback speaking their protocol (the agent's URL is configurable, so
vmpool talks to it unchanged; libcloud's metadata host is fixed, so its one fetch
function is pointed at the loopback server).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from vmpool.providers.base import PermanentProviderError
from vmpool.providers.cloud import EC2Provider, GCEProvider, OpenStackProvider
from vmpool.state.keys import Keys

from motohelp import MotoServer

AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_STS",
)


@pytest.fixture
def no_aws_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, str]] = {}
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        type(self).seen.append({"path": self.path, **dict(self.headers)})
        status, body = type(self).routes.get(self.path, (404, "{}"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[tuple[str, type[_Handler]]]:
    """A loopback HTTP server answering the routes its handler class is given."""
    handler = type("Handler", (_Handler,), {"routes": {}, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.slow
def test_irsa_web_identity_creates_on_ec2(
    moto: MotoServer, no_aws_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No key in the options or the environment: only AWS_ROLE_ARN and the projected
    token file EKS injects. The provider asks STS (moto's) for temporary credentials,
    creates an instance with them, and builds its driver again (a new STS call) once
    they are about to expire."""
    moto.reset()
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.projected-token\n")
    no_aws_env.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/vmpool-workers")
    no_aws_env.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    no_aws_env.setenv("AWS_ENDPOINT_URL_STS", moto.url)
    options = {k: v for k, v in moto.options().items() if "key" not in k}
    options["fleet_id"] = "vmpool-irsa"  # no Redis here to keep the fleet's identity
    provider = EC2Provider(None, Keys("irsa"), "aws", options)
    vm = provider.create_vm("pool", "ami-12c6146b", "vm-irsa")
    assert vm.name == "vm-irsa"
    first = provider.driver
    assert first.key.startswith("ASIA"), "temporary credentials (STS), not a long-term key"
    assert provider.driver_expires_at is not None
    assert provider.driver_expires_at > time.time() + 600
    assert provider.driver is first, "the driver is kept while its credentials are fresh"
    provider.driver_expires_at = time.time() + 60  # within the margin: build it again
    assert provider.driver is not first
    assert [vm.name for vm in provider.inventory()] == ["vm-irsa"]


def test_irsa_refused_by_sts_is_a_configuration_error(
    moto: MotoServer, no_aws_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A token file that is missing is transient (the kubelet writes it); an STS that
    refuses (here: an endpoint that answers 4xx) is permanent, naming no secret."""
    from vmpool.providers.base import TransientProviderError
    from vmpool.providers.cloud.aws_credentials import from_platform

    no_aws_env.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/vmpool-workers")
    no_aws_env.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(tmp_path / "absent"))
    with pytest.raises(TransientProviderError, match="AWS_WEB_IDENTITY_TOKEN_FILE"):
        EC2Provider(None, Keys("irsa"), "aws", {}).credentials()
    (tmp_path / "token").write_text("secret-token-text")
    env = {
        "AWS_ROLE_ARN": "not-an-arn",
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "token"),
        "AWS_ENDPOINT_URL_STS": moto.url + "/no-such-path/x",
    }
    with pytest.raises((PermanentProviderError, TransientProviderError)) as info:
        from_platform("us-east-1", env, "vmpool-aws")
    assert "secret-token-text" not in str(info.value)


def test_eks_pod_identity(no_aws_env: pytest.MonkeyPatch, tmp_path: Path, http_server: Any) -> None:
    url, handler = http_server
    handler.routes["/v1/credentials"] = (
        200,
        json.dumps(
            {
                "AccessKeyId": "ASIAPODIDENTITY",
                "SecretAccessKey": "pod-secret",
                "Token": "pod-session",
                "Expiration": "2099-01-01T00:00:00Z",
            }
        ),
    )
    auth = tmp_path / "eks-pod-identity-token"
    auth.write_text("agent-authorization\n")
    no_aws_env.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{url}/v1/credentials")
    no_aws_env.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(auth))
    provider = EC2Provider(None, Keys("f"), "aws", {})
    assert provider.credentials() == ("ASIAPODIDENTITY", "pod-secret", "pod-session")
    assert handler.seen[-1]["Authorization"] == "agent-authorization"
    found = provider.resolve_credentials()
    assert "pod-secret" not in repr(found) and found.expires_at == 4070908800.0


def test_gke_workload_identity_uses_the_metadata_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, http_server: Any
) -> None:
    """``use_metadata_server: true``: no key file; libcloud's GCE auth takes its token
    from the metadata server (GKE's, for the pod's Kubernetes service account bound to
    a Google one), asking with the Metadata-Flavor header, and sends it as Bearer."""
    import urllib.request

    from libcloud.common import google

    url, handler = http_server
    path = "/computeMetadata/v1/instance/service-accounts/default/token"
    handler.routes[path] = (
        200,
        json.dumps({"access_token": "ya29.workload", "expires_in": 3599, "token_type": "Bearer"}),
    )

    def metadata(route: str) -> tuple[int, str, str]:
        request = urllib.request.Request(f"{url}/computeMetadata/v1/{route.lstrip('/')}")
        request.add_header("Metadata-Flavor", "Google")
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.reason, response.read().decode()

    monkeypatch.setattr(google, "_get_gce_metadata", metadata)
    monkeypatch.setenv("HOME", str(tmp_path))  # libcloud caches the token in ~
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    options = {"project": "p", "zone": "us-central1-a", "use_metadata_server": True}
    driver = GCEProvider(None, Keys("f"), "gcp", options).make_driver()
    assert driver.connection.oauth2_credential.auth_type == "GCE"
    _, headers = driver.connection.pre_connect_hook({}, {})
    assert headers["Authorization"] == "Bearer ya29.workload"
    assert handler.seen[-1]["path"] == path and handler.seen[-1]["Metadata-Flavor"] == "Google"


CLOUDS_YAML = """
clouds:
  ci:
    auth:
      auth_url: https://keystone.example:5000/v3
      username: vmpool
      password: clouds-yaml-secret
      project_name: ci-project
      user_domain_name: CI
    region_name: RegionTwo
  appcred:
    auth_type: v3applicationcredential
    auth: {application_credential_id: x, application_credential_secret: y}
"""


def test_openstack_reads_a_mounted_clouds_yaml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("OS_AUTH_URL", "OS_USERNAME", "OS_PASSWORD", "OS_PROJECT_NAME", "OS_CLOUD"):
        monkeypatch.delenv(name, raising=False)
    clouds = tmp_path / "clouds.yaml"
    clouds.write_text(CLOUDS_YAML)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds))
    monkeypatch.setenv("OS_CLOUD", "ci")
    (user, password), kwargs = OpenStackProvider(
        None, Keys("f"), "os", {"flavor": "m1"}
    ).driver_args()
    assert (user, password) == ("vmpool", "clouds-yaml-secret")
    assert kwargs == {
        "ex_force_auth_url": "https://keystone.example:5000/v3",
        "ex_force_auth_version": "3.x_password",
        "ex_tenant_name": "ci-project",
        "ex_domain_name": "CI",
        "ex_force_service_region": "RegionTwo",
    }
    # The options win over the file; `cloud` wins over OS_CLOUD.
    mixed = OpenStackProvider(
        None, Keys("f"), "os", {"flavor": "m1", "cloud": "ci", "username": "u"}
    )
    assert mixed.driver_args()[0] == ("u", "clouds-yaml-secret")
    for cloud, problem in (("nope", "has no cloud 'nope'"), ("appcred", "password auth")):
        provider = OpenStackProvider(None, Keys("f"), "os", {"flavor": "m1", "cloud": cloud})
        with pytest.raises(PermanentProviderError, match=problem) as info:
            provider.driver_args()
        assert "clouds-yaml-secret" not in str(info.value)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(PermanentProviderError, match="cannot read"):
        OpenStackProvider(None, Keys("f"), "os", {"flavor": "m1"}).driver_args()
