"""Helpers shared by the tests that start processes: their output collected by a reader
thread."""

from __future__ import annotations

import threading


class Output:
    """Collects a process's output lines from a reader thread."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            with self._lock:
                self.lines.append(raw.decode(errors="replace").rstrip())

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)
