"""``provider_class: ec2``: the provider's options and the keys a pool may set for it.

Every placement key (:class:`EC2Placement`) may be set on the provider, as every pool's
default, and on a pool, overriding it for that pool: ``instance_type`` (vmpooler:
``amisize``), ``availability_zone`` (``zone``), ``subnet_id``, ``security_group_ids``,
``key_name``, ``user_data``, ``tags``, ``iam_instance_profile``, ``volume_size``,
``volume_type``, ``image_filters`` / ``image_owners``, ``spot`` / ``spot_max_price``,
``ready_check``, ``ssh_port``.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AliasChoices, ConfigDict, Field, ValidationInfo, field_validator

from vmpool.providers.cloud.options import CloudOptions, Secret
from vmpool.providers.cloud.placement import (
    CloudPlacement,
    PoolChecks,
    VolumeSize,
    provider_value,
)
from vmpool.providers.options import expect, invalid, number

__all__ = ["EC2Options", "EC2Placement", "EC2PoolOptions"]

Price = Annotated[
    float, Field(gt=0, le=1000, allow_inf_nan=False), expect("a price in USD per hour", number)
]
# DescribeImages filters: name -> a value or a list of values (wildcards allowed).
ImageFilters = dict[str, str | list[str]]


class EC2Placement(CloudPlacement):
    """Where and how EC2 makes a pool's instances."""

    instance_type: str | None = Field(
        None,
        validation_alias=AliasChoices("instance_type", "amisize"),
        description="The instance type (vmpooler: amisize)",
    )
    availability_zone: str | None = Field(
        None,
        validation_alias=AliasChoices("availability_zone", "zone"),
        description="The availability zone (vmpooler: zone; default: EC2's choice)",
    )
    subnet_id: str | None = Field(None, description="The subnet instances start in")
    security_group_ids: list[str] | None = Field(
        None,
        validate_default=True,
        description="Security group ids (they belong to a VPC: a subnet_id is needed)",
    )
    key_name: str | None = Field(None, description="The key pair installed on instances")
    iam_instance_profile: str | None = Field(
        None, description="The IAM instance profile: a name or an ARN"
    )
    volume_size: VolumeSize | None = Field(
        None, description="The root volume's size in GB (default: the image's)"
    )
    volume_type: str | None = Field(
        None, description="The root volume's type: gp3, gp2, io1, ... (default: the image's)"
    )
    image_filters: ImageFilters | None = Field(
        None,
        description="DescribeImages filters (name: value or [values]); the newest image"
        " matching them is used instead of the pool's template",
    )
    image_owners: list[str] | None = Field(
        None, description="Image owners for image_filters: account ids, self, amazon, ..."
    )
    spot: bool | None = Field(None, description="Launch spot instances (one-time)")
    spot_max_price: Price | None = Field(
        None, description="The most to pay per hour for a spot instance (default: on-demand)"
    )

    @field_validator("security_group_ids")
    @classmethod
    def _groups_need_a_subnet(cls, value: list[str] | None, info: ValidationInfo) -> Any:
        """A pool's security groups need a subnet (its own or the provider's).

        The groups are the pool's own or the provider's. Groups belong to a VPC, and the
        subnet names which."""
        if info.context is None:  # the provider's own options: checked per pool
            return value
        groups = value if value is not None else provider_value(info, "security_group_ids")
        subnet = info.data.get("subnet_id") or provider_value(info, "subnet_id")
        if groups and not subnet:
            raise invalid(
                "needs a subnet_id (on the pool or its provider): security groups belong to"
                " a VPC, and the subnet says which"
            )
        return value


class EC2PoolOptions(EC2Placement, PoolChecks):
    """The keys a pool of an ``ec2`` provider may set (``ProviderClass.pool_options``)."""


class EC2Options(CloudOptions, EC2Placement):
    """``provider_class: ec2``.

    Credentials: the options, else AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and
    AWS_SESSION_TOKEN) from the environment, else the pod's role (IRSA or EKS Pod
    Identity: :mod:`vmpool.providers.cloud.aws_credentials`)."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)

    region: str = Field("us-east-1", description="The AWS region")
    endpoint: str | None = Field(
        None, description="An EC2-compatible endpoint URL (default: the region's)"
    )
    access_key_id: Secret | None = Field(
        None,
        validation_alias=AliasChoices("access_key_id", "ABS_AWS_ACCESS_KEY"),
        description="Access key id (secret; vmpooler: ABS_AWS_ACCESS_KEY)",
    )
    secret_access_key: Secret | None = Field(
        None,
        validation_alias=AliasChoices("secret_access_key", "ABS_AWS_SECRET_KEY"),
        description="Secret access key (secret; vmpooler: ABS_AWS_SECRET_KEY)",
    )
    session_token: Secret | None = Field(None, description="Session token (secret)")
    instance_type: str = Field(
        "t3.micro",
        validation_alias=AliasChoices("instance_type", "amisize"),
        description="The instance type (vmpooler: amisize)",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"endpoint must be an http(s) URL, got {value!r}")
        return value
