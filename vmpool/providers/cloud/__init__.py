"""Real clouds through Apache Libcloud (the ``cloud`` extra): EC2, GCE, OpenStack.

Importing this package does not import libcloud: a provider imports it when it first
talks to its cloud, so a fleet with only the simulated provider runs without the extra.
docs/providers.md describes each provider's options, tags and ready check.
"""

from vmpool.providers.cloud.common import TAG_KEYS, CloudOptions, CloudProvider
from vmpool.providers.cloud.ec2 import EC2Options, EC2PoolOptions, EC2Provider
from vmpool.providers.cloud.gce import GCEOptions, GCEPoolOptions, GCEProvider
from vmpool.providers.cloud.openstack import (
    OpenStackOptions,
    OpenStackPoolOptions,
    OpenStackProvider,
)

__all__ = [
    "TAG_KEYS",
    "CloudOptions",
    "CloudProvider",
    "EC2Options",
    "EC2PoolOptions",
    "EC2Provider",
    "GCEOptions",
    "GCEPoolOptions",
    "GCEProvider",
    "OpenStackOptions",
    "OpenStackPoolOptions",
    "OpenStackProvider",
]
