"""uvicorn's access log, every line kept, formatted and written off the event loop.

uvicorn logs each response from its event loop through a ``StreamHandler``: the line is
formatted and written there, one ``write`` system call per line (``vmpool up`` runs its
children unbuffered into a pipe). That was a tenth of the API's busy loop time under load
(profiled: docs/benchmarks.md). :class:`BatchedStreamHandler` only queues the record on
the loop; a thread of its own formats what has queued and writes it in one call every
:data:`FLUSH_INTERVAL_S`, in order. A flush (``logging.shutdown`` at exit, or a test)
writes everything queued before it returns.

:func:`uvicorn_log_config` is uvicorn's own logging config with this handler for the
access log: same format, same stream, same levels.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import deque
from typing import Any, Final, TextIO

__all__ = ["FLUSH_INTERVAL_S", "BatchedStreamHandler", "uvicorn_log_config"]

# How long a line may wait in the queue: an access log is read by people and shippers.
FLUSH_INTERVAL_S: Final = 0.05


class BatchedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A ``StreamHandler`` whose ``emit`` queues; a daemon thread formats and writes."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream)
        self.queued: deque[logging.LogRecord] = deque()
        self.stopped = threading.Event()
        self.writing = threading.Lock()  # one drain at a time keeps the lines in order
        self.writer: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.queued.append(record)
        if self.writer is None:  # under the handler's lock (Handler.handle)
            self.writer = threading.Thread(target=self._run, name="access-log", daemon=True)
            self.writer.start()

    def flush(self) -> None:
        """Write every record queued so far, then flush the stream."""
        self._drain()

    def close(self) -> None:
        self.stopped.set()
        self._drain()
        super().close()

    def _run(self) -> None:
        while not self.stopped.wait(FLUSH_INTERVAL_S):
            self._drain()

    def _drain(self) -> None:
        with self.writing:
            lines = []
            while self.queued:
                record = self.queued.popleft()
                try:
                    lines.append(self.format(record) + self.terminator)
                except Exception:
                    self.handleError(record)
            try:
                if lines:
                    self.stream.write("".join(lines))
                if self.stream and hasattr(self.stream, "flush"):
                    self.stream.flush()
            except Exception:  # the stream is gone (a closed pipe): as StreamHandler does
                self.handleError(logging.makeLogRecord({"msg": "access log write failed"}))


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's default logging config, its access log through :class:`BatchedStreamHandler`."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["access"]["class"] = f"{__name__}.{BatchedStreamHandler.__name__}"
    return config
