"""A pool's optional ``dns`` section.

vmpool keeps ``<vm name>.<domain>`` pointing at the VM's address through one of Libcloud's
DNS drivers (Route 53, Google Cloud DNS, ...), as vmpooler's dns plugins do. The record is
made before the VM is handed out (a VM whose record could not be made is not ready yet)
and removed when the VM is destroyed.

Route 53 goes through a driver of our own on Libcloud's: its current API version
(2013-04-01, where Libcloud speaks 2012-02-29) signed with SigV4, so it works against
AWS and against any Route 53-compatible endpoint (``endpoint``: moto's server in the
tests). Other drivers are Libcloud's as they are (``driver``: the name of a
``libcloud.dns.types.Provider``, ``options``: their keyword arguments).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr

from vmpool.providers.base import PermanentProviderError

__all__ = ["DnsOptions", "PoolDns", "Secret"]

log = logging.getLogger(__name__)


def _secret_text(value: Any) -> Any:
    """A number given for a secret is its text: never a type error that would quote it."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


# A secret option: shown as '**********' by any repr, log line or error message.
Secret = Annotated[SecretStr, BeforeValidator(_secret_text)]


ROUTE53_OLD, ROUTE53_NEW = "2012-02-29", "2013-04-01"


class DnsOptions(BaseModel):
    """A pool's ``dns`` section."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    driver: str = Field(description="Libcloud's DNS provider: route53, google, ...")
    zone: str | None = Field(None, description="The zone's domain (default: the pool's domain)")
    ttl: int = Field(300, ge=1, le=86400, description="The records' TTL in seconds")
    key: Secret | None = Field(
        None, description="The driver's key (route53: access key id; else AWS_ACCESS_KEY_ID)"
    )
    secret: Secret | None = Field(
        None, description="The driver's secret (route53: else AWS_SECRET_ACCESS_KEY)"
    )
    endpoint: str | None = Field(None, description="A Route 53-compatible endpoint URL")
    options: dict[str, Any] = Field(
        default_factory=dict, description="More keyword arguments for the driver"
    )


class PoolDns:
    """The DNS records of one pool's VMs: ``name.domain`` A (or AAAA) the address."""

    def __init__(self, options: DnsOptions, domain: str) -> None:
        self.options = options
        self.domain = (options.zone or domain).rstrip(".")
        self._driver: Any = None
        self._zone: Any = None

    @property
    def driver(self) -> Any:
        if self._driver is None:
            self._driver = _make_driver(self.options)
        return self._driver

    @property
    def zone(self) -> Any:
        if self._zone is None:
            zones = [z for z in self.driver.list_zones() if z.domain.rstrip(".") == self.domain]
            if not zones:
                raise PermanentProviderError(
                    f"configuration error: no DNS zone {self.domain!r} at {self.options.driver}"
                )
            self._zone = zones[0]
        return self._zone

    def publish(self, name: str, address: str) -> None:
        """``name.domain`` -> ``address``, made or corrected (idempotent)."""
        from libcloud.dns.types import RecordType

        kind = RecordType.AAAA if ":" in address else RecordType.A
        record = self._find(name, kind)
        if record is not None and record.data == address:
            return
        if record is not None:
            self.driver.delete_record(record)
        extra = {"ttl": self.options.ttl}
        self.driver.create_record(name, self.zone, kind, address, extra=extra)
        log.info("dns: %s.%s -> %s", name, self.domain, address)

    def withdraw(self, name: str) -> bool:
        """Remove ``name.domain``. Whether there was a record."""
        from libcloud.dns.types import RecordType

        found = False
        for kind in (RecordType.A, RecordType.AAAA):
            record = self._find(name, kind)
            if record is not None:
                self.driver.delete_record(record)
                found = True
        return found

    def _find(self, name: str, kind: Any) -> Any:
        """The record of ``name`` of type ``kind``, None when there is none.

        Route 53: one filtered read. Other drivers: the zone's list."""
        from libcloud.dns.types import RecordDoesNotExistError

        if self.options.driver == "route53":
            code = self.driver.RECORD_TYPE_MAP[kind]
            try:
                return self.driver.get_record(self.zone.id, f"{code}:{name}")
            except (RecordDoesNotExistError, IndexError):
                return None
        for record in self.zone.list_records():
            if record.name == name and record.type == kind:
                return record
        return None


def _make_driver(options: DnsOptions) -> Any:
    if options.driver == "route53":
        return _route53(options)
    from libcloud.dns.providers import get_driver
    from libcloud.dns.types import Provider

    try:
        cls = get_driver(getattr(Provider, options.driver.upper()))
    except AttributeError:
        raise PermanentProviderError(
            f"configuration error: no Libcloud DNS driver {options.driver!r}"
        ) from None
    args = [s.get_secret_value() for s in (options.key, options.secret) if s is not None]
    return cls(*args, **options.options)


def _route53(options: DnsOptions) -> Any:
    key = options.key.get_secret_value() if options.key else os.environ.get("AWS_ACCESS_KEY_ID")
    secret = (
        options.secret.get_secret_value()
        if options.secret
        else os.environ.get("AWS_SECRET_ACCESS_KEY")
    )
    if not key or not secret:
        raise PermanentProviderError(
            "configuration error: dns route53 has no credentials (key/secret, or"
            " AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
        )
    kwargs: dict[str, Any] = dict(options.options)
    if options.endpoint:
        parts = urlsplit(options.endpoint)
        secure = parts.scheme == "https"
        kwargs.update(
            host=parts.hostname, secure=secure, port=parts.port or (443 if secure else 80)
        )
    return route53_driver_class()(key, secret, **kwargs)


def _swap(body: Any, old: str, new: str) -> Any:
    if isinstance(body, str):
        return body.replace(old, new)
    if isinstance(body, bytes):
        return body.replace(old.encode(), new.encode())
    return body


def route53_driver_class() -> Any:
    """Libcloud's Route 53 driver on the current API version, signed with SigV4."""
    from libcloud.common.aws import SignedAWSConnection
    from libcloud.dns.drivers import route53

    class Response(route53.Route53DNSResponse):  # type: ignore[misc]
        def parse_body(self) -> Any:
            self.body = _swap(getattr(self, "body", None), ROUTE53_NEW, ROUTE53_OLD)
            return super().parse_body()

        def parse_error(self) -> Any:
            self.body = _swap(getattr(self, "body", None), ROUTE53_NEW, ROUTE53_OLD)
            return super().parse_error()

    class Connection(SignedAWSConnection):  # type: ignore[misc]
        host = route53.API_HOST
        responseCls = Response
        service_name = "route53"
        version = ROUTE53_NEW

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["signature_version"] = "4"
            super().__init__(*args, **kwargs)

        def add_default_params(self, params: Mapping[str, Any]) -> Any:
            return params  # a REST API: no Version parameter

        def request(self, action: str, *args: Any, **kwargs: Any) -> Any:
            action = action.replace(f"/{ROUTE53_OLD}/", f"/{ROUTE53_NEW}/")
            if "data" in kwargs:
                kwargs["data"] = _swap(kwargs["data"], ROUTE53_OLD, ROUTE53_NEW)
            return super().request(action, *args, **kwargs)

    class Driver(route53.Route53DNSDriver):  # type: ignore[misc]
        connectionCls = Connection
        region_name = "us-east-1"  # Route 53 is global. SigV4 signs it in us-east-1

    return Driver
