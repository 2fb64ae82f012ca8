"""AWS credentials a pod gets from its platform: IRSA and EKS Pod Identity.

libcloud's EC2 driver takes a key, a secret and a session token, and nothing else: it
knows no credential chain. :func:`from_platform` is the part of AWS's chain that a pod
on EKS needs, after the provider's own options and ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``:

- **IRSA** (IAM roles for service accounts): EKS puts ``AWS_ROLE_ARN`` and
  ``AWS_WEB_IDENTITY_TOKEN_FILE`` (a projected service-account token) in the pod's
  environment. STS ``AssumeRoleWithWebIdentity`` (an unsigned call) turns the token
  into temporary credentials. The STS endpoint is ``AWS_ENDPOINT_URL_STS`` (or
  ``AWS_ENDPOINT_URL``) when set, else the region's.
- **EKS Pod Identity** (and ECS task roles): ``AWS_CONTAINER_CREDENTIALS_FULL_URI`` with
  ``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`` (or ``AWS_CONTAINER_AUTHORIZATION_TOKEN``),
  a GET of the agent's JSON.

Temporary credentials carry their expiry: the provider builds a new driver before it
(``CloudProvider.driver``). Errors name the source and AWS's code, never a credential:
a 4xx of STS is permanent (a wrong role or trust policy does not mend by retrying),
throttling, 5xx and network failures are transient.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from vmpool.providers.base import PermanentProviderError, TransientProviderError

__all__ = ["AwsCredentials", "assume_role_with_web_identity", "from_platform", "sts_endpoint"]

STS_NS: Final = "{https://sts.amazonaws.com/doc/2011-06-15/}"
# Temporary credentials asked for (STS' default for a web identity is one hour).
DURATION_S: Final = 3600
HTTP_TIMEOUT_S: Final = 10.0
THROTTLED: Final = ("Throttling", "ThrottlingException", "RequestLimitExceeded")


@dataclass(frozen=True)
class AwsCredentials:
    """A key pair, its session token for temporary credentials, and when they expire.

    ``expires_at``: Unix time (None: never). ``source`` says where they came from (for logs)."""

    key: str
    secret: str
    token: str | None = None
    expires_at: float | None = None
    source: str = "static"

    def __repr__(self) -> str:
        return f"AwsCredentials(source={self.source!r}, expires_at={self.expires_at!r})"


def from_platform(region: str, env: Mapping[str, str], session_name: str) -> AwsCredentials | None:
    """Credentials from IRSA or EKS Pod Identity, as ``env`` offers them.

    None when it offers neither."""
    role, token_file = env.get("AWS_ROLE_ARN"), env.get("AWS_WEB_IDENTITY_TOKEN_FILE")
    if role and token_file:
        token = _read(token_file, "AWS_WEB_IDENTITY_TOKEN_FILE")
        return assume_role_with_web_identity(
            role, token, sts_endpoint(region, env), env.get("AWS_ROLE_SESSION_NAME") or session_name
        )
    uri = env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
    if uri:
        auth_file = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
        if auth_file:
            auth = _read(auth_file, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
        else:
            auth = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN", "")
        return container_credentials(uri, auth)
    return None


def sts_endpoint(region: str, env: Mapping[str, str]) -> str:
    explicit = env.get("AWS_ENDPOINT_URL_STS") or env.get("AWS_ENDPOINT_URL")
    return explicit.rstrip("/") if explicit else f"https://sts.{region}.amazonaws.com"


def assume_role_with_web_identity(
    role_arn: str, token: str, endpoint: str, session_name: str
) -> AwsCredentials:
    """STS ``AssumeRoleWithWebIdentity`` (unsigned: the token is the proof)."""
    body = urllib.parse.urlencode(
        {
            "Action": "AssumeRoleWithWebIdentity",
            "Version": "2011-06-15",
            "RoleArn": role_arn,
            "RoleSessionName": session_name[:64],
            "WebIdentityToken": token,
            "DurationSeconds": str(DURATION_S),
        }
    ).encode()
    request = urllib.request.Request(endpoint + "/", data=body, method="POST")
    request.add_header("Content-Type", "application/x-www-form-urlencoded")
    reply = _fetch(request, "STS AssumeRoleWithWebIdentity")
    try:
        root = ET.fromstring(reply)
        creds = root.find(f"{STS_NS}AssumeRoleWithWebIdentityResult/{STS_NS}Credentials")
        if creds is None:
            raise ValueError("no Credentials element")
        return AwsCredentials(
            key=_text(creds, "AccessKeyId"),
            secret=_text(creds, "SecretAccessKey"),
            token=_text(creds, "SessionToken"),
            expires_at=_timestamp(_text(creds, "Expiration")),
            source="web identity (IRSA)",
        )
    except (ET.ParseError, ValueError) as exc:
        raise TransientProviderError(f"STS AssumeRoleWithWebIdentity: bad answer ({exc})") from None


def container_credentials(uri: str, authorization: str) -> AwsCredentials:
    """The container credentials agent's JSON (EKS Pod Identity, ECS)."""
    request = urllib.request.Request(uri)
    if authorization:
        request.add_header("Authorization", authorization.strip())
    reply = _fetch(request, "container credentials")
    try:
        data = json.loads(reply)
        expiration = data.get("Expiration")
        return AwsCredentials(
            key=str(data["AccessKeyId"]),
            secret=str(data["SecretAccessKey"]),
            token=data.get("Token"),
            expires_at=_timestamp(expiration) if expiration else None,
            source="container credentials (Pod Identity)",
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise TransientProviderError(
            f"container credentials: bad answer ({type(exc).__name__})"
        ) from None


def _fetch(request: urllib.request.Request, what: str) -> bytes:
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as exc:
        code = _error_code(exc.read())
        message = f"{what}: HTTP {exc.code}{f' {code}' if code else ''}"
        if exc.code >= 500 or exc.code == 429 or code in THROTTLED:
            raise TransientProviderError(message) from None
        raise PermanentProviderError(f"configuration error: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise TransientProviderError(f"{what}: {type(exc).__name__}: {exc}") from None


def _error_code(body: bytes) -> str:
    """AWS's error code from an error answer (XML ``<Code>``), '' when none is found."""
    try:
        for element in ET.fromstring(body).iter():
            if element.tag.endswith("Code") and element.text:
                return element.text.strip()
    except ET.ParseError:
        pass
    return ""


def _read(path: str, variable: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as exc:
        raise TransientProviderError(
            f"cannot read {variable} ({type(exc).__name__}: {path})"
        ) from None


def _text(parent: ET.Element, tag: str) -> str:
    element = parent.find(f"{STS_NS}{tag}")
    if element is None or not element.text:
        raise ValueError(f"no {tag}")
    return element.text.strip()


def _timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
