"""A power cut of a Redis server, played exactly: its append-only file is cut back to
what it had fsynced (tests/native/fsync_log.c records that), and it starts again.

``appendfsync everysec`` acknowledges writes before they are on disk: a crash of the
machine loses them. With per-write durability (WAITAOF) a write is acknowledged only
once fsynced, so the cut never reaches it. The tests and the chaos soak use this to
show both.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SHIM_SOURCE = Path(__file__).resolve().parent / "native" / "fsync_log.c"
NEEDS = "the C compiler (Debian package gcc)"


def build_shim(directory: Path) -> Path | None:
    """Compile the fsync-recording shim into ``directory``; None without a compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = directory / "fsync_log.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE), "-ldl"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return out


def preload_env(shim: Path, log: Path) -> dict[str, str]:
    """What a server process needs in its environment to record its fsyncs."""
    return {"LD_PRELOAD": str(shim), "FSYNC_LOG": str(log)}


def fsynced_sizes(log: Path) -> dict[str, int]:
    """The largest size known on disk, per file path, from the shim's log."""
    sizes: dict[str, int] = {}
    if not log.exists():
        return sizes
    for line in log.read_text(errors="replace").splitlines():
        size, _, path = line.partition(" ")
        if size.isdigit() and path:
            sizes[path] = max(sizes.get(path, 0), int(size))
    return sizes


def cut_to_fsynced(data_dir: Path, log: Path) -> int:
    """Cut every file of the server's append-only directory back to what was fsynced
    (a file never fsynced keeps nothing); the bytes cut. Call it on a killed server."""
    sizes = fsynced_sizes(log)
    cut = 0
    aof_dir = data_dir / "appendonlydir"
    for path in sorted(aof_dir.glob("*.aof")):
        if not path.name.endswith(".incr.aof"):
            continue  # the base is written whole and fsynced before the manifest names it
        keep = sizes.get(str(path.resolve()), 0)
        size = path.stat().st_size
        if size > keep:
            with path.open("r+b") as f:
                f.truncate(keep)
            cut += size - keep
    return cut
