"""vmpooler's `:config:` keys for its vSphere provider (`create_folders`,
`create_linked_clones`, `create_template_delta_disks`), honoured where vmpooler reads
them: in `:config:`, each the default of every vSphere provider that does not set its
own. They were ignored without a word: every clone failed with "folder not found
(create_folders: false)", and linked clones of a template without a snapshot failed
where vmpooler makes the delta disks itself.

On govmomi's vCenter simulator (tests/vcsimhelp.py), through the config loader and the
provider registry as a fleet builds them.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import redis

from vmpool.config import parse_config
from vmpool.providers import PermanentProviderError
from vmpool.providers.registry import providers_from_config
from vmpool.state.keys import Keys

from vcsimhelp import VCSim

pytestmark = pytest.mark.slow  # the simulator: built on first use, a process of its own

_unique = itertools.count(1)


def _config(vcsim: VCSim, folder: str, template: str, **config: Any) -> Any:
    """A vmpooler config: :providers: :vsphere: without the three keys, one pool."""
    options = vcsim.options(fleet_id=f"vmpooler-keys-{next(_unique)}")
    data = {
        ":config": config,
        ":providers": {":vsphere": options},
        ":pools": [{"name": "deb", "template": template, "provider": "vsphere", "folder": folder}],
    }
    return parse_config(data, source="vmpooler.yaml", env={})


def _template(si: Any, name: str) -> Any:
    """A template of the test's own, without a snapshot."""
    from pyVim.task import WaitForTask
    from pyVmomi import vim

    index = si.content.searchIndex
    spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec(), powerOn=False, template=False)
    source = index.FindByInventoryPath("DC0/vm/DC0_H0_VM0")
    WaitForTask(
        source.CloneVM_Task(
            folder=index.FindByInventoryPath("DC0/vm/templates"), name=name, spec=spec
        )
    )
    return index.FindByInventoryPath(f"DC0/vm/templates/{name}")


def test_config_create_folders_clones_into_a_folder_that_did_not_exist(
    vcsim: VCSim, redis_client: redis.Redis
) -> None:
    n = next(_unique)
    folder = f"vmpooler-new-{n}/debian"
    si = vcsim.client()
    assert si.content.searchIndex.FindByInventoryPath(f"DC0/vm/{folder}") is None
    config = _config(vcsim, folder, "templates/debian-12", create_folders=True)
    assert config.providers["vsphere"].options["create_folders"] is True
    provider = providers_from_config(redis_client, Keys("k"), config)["vsphere"]
    vm = provider.create_vm("deb", "templates/debian-12", f"vm-folder-{n}")
    try:
        made = si.content.searchIndex.FindByInventoryPath(f"DC0/vm/{folder}/vm-folder-{n}")
        assert made is not None and made.runtime.powerState == "poweredOn"
    finally:
        provider.destroy_vm("deb", vm.name)


def test_linked_clones_make_the_templates_delta_disks(
    vcsim: VCSim, redis_client: redis.Redis
) -> None:
    """create_linked_clones with create_template_delta_disks: the template without a
    snapshot gets one (its disks a delta layer) and the clone links to it; without
    create_template_delta_disks the same clone is refused, naming the template."""
    n = next(_unique)
    si = vcsim.client()
    template = _template(si, f"bare-{n}")
    folder = f"vmpooler-linked-{n}"
    keys = {"create_folders": True, "create_linked_clones": True}
    plain = _config(vcsim, folder, f"templates/bare-{n}", **keys)
    refusing = providers_from_config(redis_client, Keys("k"), plain)["vsphere"]
    with pytest.raises(PermanentProviderError, match="no snapshot to link clones to"):
        refusing.create_vm("deb", f"templates/bare-{n}", f"vm-nolink-{n}")
    config = _config(vcsim, folder, f"templates/bare-{n}", create_template_delta_disks=True, **keys)
    provider = providers_from_config(redis_client, Keys("k"), config)["vsphere"]
    vm = provider.create_vm("deb", f"templates/bare-{n}", f"vm-linked-{n}")
    try:
        assert [s.name for s in template.snapshot.rootSnapshotList] == ["vmpool-delta-disks"]
        made = si.content.searchIndex.FindByInventoryPath(f"DC0/vm/{folder}/vm-linked-{n}")
        assert made is not None and made.runtime.powerState == "poweredOn"
    finally:
        provider.destroy_vm("deb", vm.name)
