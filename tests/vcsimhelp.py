"""govmomi's vCenter simulator as a real process on loopback (tests only).

``build(cache)`` compiles tests/vcsim/main.go against Debian's govmomi
(golang-go, golang-github-vmware-govmomi-dev: offline, no module proxy) into ``cache``,
once per source and toolchain, and answers None when the packages are absent.
``build_cache()`` is where: outside the checkout (``VMPOOL_TEST_CACHE``, else
``$XDG_CACHE_HOME/vmpool-tests``, else ``~/.cache/vmpool-tests``), so a fresh clone, a
``make clean`` or ``pytest --cache-clear`` reuses a build whose inputs are unchanged;
the binary's name is the hash of those inputs (Go's version, govmomi's source, main.go),
so a change to any of them builds anew, and the older binaries are removed then. One
build at a time (a file lock in ``cache``): parallel workers wait for it and share it.
``VCSim.start()`` runs it on a free loopback port (the simulator picks it and prints
its URL), with a login of the test's choosing; ``stop()`` kills it by pid.
``VCSim.client()`` is a pyVmomi session of the test's own, to make hand-made VMs and
look at what the provider made.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGES = "golang-go and golang-github-vmware-govmomi-dev"
GOCODE = Path("/usr/share/gocode")
SOURCE = Path(__file__).parent / "vcsim" / "main.go"
USER, PASSWORD = "vmpool-test", "vcsim-secret"


def build_cache() -> Path:
    """The machine's build cache of the tests (see the module docstring)."""
    root = os.environ.get("VMPOOL_TEST_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "vmpool-tests")
    cache = Path(root) / "vcsim"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def build(cache: Path, timeout_s: float = 300.0) -> Path | None:
    """The simulator's binary, built into ``cache`` if it is not there yet; None when
    Go or govmomi's sources are not installed."""
    go = shutil.which("go")
    if go is None or not (GOCODE / "src/github.com/vmware/govmomi/simulator").is_dir():
        return None
    binary = binary_for(cache, go)
    # One build at a time per cache: pytest-xdist's workers (and other checkouts) wait
    # for the first one's build, then find its binary, instead of each compiling its own.
    with (cache / "build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            _compile(go, cache, binary, timeout_s)
    return binary


def binary_for(cache: Path, go: str) -> Path:
    """The binary's path in ``cache``: named by the hash of Go's version, govmomi's
    source and main.go."""
    version = subprocess.run([go, "version"], capture_output=True, text=True, timeout=30).stdout
    govmomi = (GOCODE / "src/github.com/vmware/govmomi/simulator/model.go").stat()
    stamp = f"{version}{govmomi.st_size}:{govmomi.st_mtime_ns}".encode() + SOURCE.read_bytes()
    return cache / f"vcsim-{hashlib.sha256(stamp).hexdigest()[:16]}"


def _compile(go: str, cache: Path, binary: Path, timeout_s: float) -> None:
    """Compile main.go into ``binary`` and remove the cache's other binaries."""
    work = cache / f"build-{os.getpid()}"
    package = work / "src" / "vmpoolvcsim"
    package.mkdir(parents=True, exist_ok=True)
    shutil.copy(SOURCE, package / "main.go")
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOFLAGS": "",
        "GOPROXY": "off",
        "GOPATH": f"{work}:{GOCODE}",
        "GOCACHE": str(cache / "gocache"),
    }
    try:
        subprocess.run(
            [go, "build", "-o", str(work / "vcsim"), "vmpoolvcsim"],
            cwd=work,
            env=env,
            check=True,
            capture_output=True,
            timeout=timeout_s,
        )
        os.replace(work / "vcsim", binary)  # atomic: a reader sees no half-written binary
        for old in cache.glob("vcsim-*"):
            if old != binary:
                old.unlink(missing_ok=True)
    except subprocess.CalledProcessError as exc:
        raise AssertionError(f"building vcsim failed: {exc.stderr.decode()[-2000:]}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class VCSim:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @classmethod
    def start(cls, binary: Path, log: Path, timeout_s: float = 30.0) -> VCSim:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(binary), "-listen", "127.0.0.1:0"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "VCSIM_USERNAME": USER, "VCSIM_PASSWORD": PASSWORD},
            )
        deadline = time.monotonic() + timeout_s
        while True:
            text = log.read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith("URL "):
                    port = int(line.split(":")[-1].split("/")[0])
                    return cls(proc, port, log)
            if proc.poll() is not None or time.monotonic() > deadline:
                cls(proc, 0, log).stop()
                raise AssertionError(f"vcsim did not start: {text[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def options(self, **extra: Any) -> dict[str, Any]:
        return {
            "server": self.server,
            "username": USER,
            "password": PASSWORD,
            "insecure": True,
            "ready_check": "state",
            "backoff": 0.05,
            **extra,
        }

    def client(self) -> Any:
        """A pyVmomi ServiceInstance of the test's own."""
        from pyVim.connect import SmartConnect

        return SmartConnect(
            host="127.0.0.1", port=self.port, user=USER, pwd=PASSWORD, disableSslCertValidation=True
        )


def hand_made(
    si: Any, source: str, folder: str, name: str, marks: dict[str, str] | None = None
) -> Any:
    """A VM someone made by hand (``marks``: guestinfo.vmpool.* extraConfig it carries),
    cloned from ``source`` into ``folder`` (paths below DC0's VM folder), powered on."""
    from pyVim.task import WaitForTask
    from pyVmomi import vim

    index = si.content.searchIndex
    extra = [
        vim.option.OptionValue(key=f"guestinfo.vmpool.{k}", value=v)
        for k, v in (marks or {}).items()
    ]
    spec = vim.vm.CloneSpec(
        location=vim.vm.RelocateSpec(),
        powerOn=False,
        template=False,
        config=vim.vm.ConfigSpec(extraConfig=extra),
    )
    task = index.FindByInventoryPath(f"DC0/vm/{source}").CloneVM_Task(
        folder=index.FindByInventoryPath(f"DC0/vm/{folder}"), name=name, spec=spec
    )
    WaitForTask(task)
    vm = task.info.result
    WaitForTask(vm.PowerOnVM_Task())
    return vm


TEMPLATE = "templates/debian-12"  # has a snapshot: linked clones
BARE_TEMPLATE = "templates/bare"  # has none
CONTRACT_TEMPLATE = "img-1"  # the provider contract suite's template name


def prepare(si: Any) -> None:
    """Two templates in DC0/vm/templates and the contract suite's in DC0/vm, made from
    the model's DC0_H0_VM0."""
    from pyVim.task import WaitForTask
    from pyVmomi import vim

    index = si.content.searchIndex
    folder = index.FindByInventoryPath("DC0/vm").CreateFolder("templates")
    source = index.FindByInventoryPath("DC0/vm/DC0_H0_VM0")
    root = index.FindByInventoryPath("DC0/vm")
    for into, name in ((folder, "debian-12"), (folder, "bare"), (root, CONTRACT_TEMPLATE)):
        spec = vim.vm.CloneSpec(location=vim.vm.RelocateSpec(), powerOn=False, template=False)
        WaitForTask(source.CloneVM_Task(folder=into, name=name, spec=spec))
    template = index.FindByInventoryPath(f"DC0/vm/{TEMPLATE}")
    WaitForTask(
        template.CreateSnapshot_Task(name="base", description="", memory=False, quiesce=False)
    )
