"""vSphere through pyVmomi (the ``vsphere`` extra): docs/providers.md, "vSphere".

Importing this package does not import pyVmomi: the provider imports it when it first
connects, so a fleet without a vSphere pool runs without the extra.
"""

from vmpool.providers.vsphere.options import VSphereOptions, VSpherePoolOptions
from vmpool.providers.vsphere.provider import VSphereProvider

__all__ = ["VSphereOptions", "VSpherePoolOptions", "VSphereProvider"]
