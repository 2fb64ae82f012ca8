"""The API's access log (vmpool.api.access_log): every line uvicorn logs is written, in
order and as uvicorn formats it, in batches by a thread of its own; `vmpool api` runs
uvicorn with it."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import uvicorn
from click.testing import CliRunner
from uvicorn.config import LOGGING_CONFIG

from vmpool.api.access_log import BatchedStreamHandler, uvicorn_log_config
from vmpool.cli.main import cli

from apihelp import spec_data
from storehelp import wait_until


class CountingStream(io.StringIO):
    """A text stream that counts its ``write`` calls (one system call each on a pipe)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def _access_logger(config: dict[str, Any], stream: io.StringIO) -> logging.Logger:
    """uvicorn's access logger configured by ``config``, writing to ``stream``."""
    config = json.loads(json.dumps(config))
    config["handlers"]["access"]["stream"] = stream
    logging.config.dictConfig(config)
    return logging.getLogger("uvicorn.access")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """uvicorn's loggers put back after the test as they were (dictConfig replaces them)."""
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    saved = [(list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for logger, (handlers, level, propagate) in zip(loggers, saved, strict=True):
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def _log_responses(logger: logging.Logger, n: int) -> None:
    for i in range(n):
        logger.info('%s - "%s %s HTTP/%s" %d', f"127.0.0.1:{i}", "GET", f"/x/{i}", "1.1", 200)


def test_every_line_is_written_in_order_as_uvicorn_formats_it(restore_logging: None) -> None:
    """Proves: what the batched handler writes is, line for line, what uvicorn's own
    StreamHandler writes, and uvicorn's handler makes a write call per line where the
    batched one makes a few for a thousand (so the event loop does not)."""
    plain, batched = CountingStream(), CountingStream()
    _log_responses(_access_logger(LOGGING_CONFIG, plain), 1000)
    logger = _access_logger(uvicorn_log_config(), batched)
    assert [type(h) for h in logger.handlers] == [BatchedStreamHandler]
    _log_responses(logger, 1000)
    logger.handlers[0].flush()
    assert batched.getvalue() == plain.getvalue()
    assert len(plain.getvalue().splitlines()) == 1000
    assert plain.writes >= 1000
    assert batched.writes < 50


def test_lines_are_written_without_a_flush(restore_logging: None) -> None:
    """Proves: the handler's thread writes what was logged on its own, soon."""
    stream = CountingStream()
    _log_responses(_access_logger(uvicorn_log_config(), stream), 3)
    wait_until(lambda: len(stream.getvalue().splitlines()) == 3, timeout=5)


def test_close_writes_what_is_queued(restore_logging: None) -> None:
    """Proves: closing the handler (logging.shutdown at exit) loses no line."""
    stream = CountingStream()
    logger = _access_logger(uvicorn_log_config(), stream)
    _log_responses(logger, 500)
    handler = logger.handlers[0]
    handler.close()
    assert len(stream.getvalue().splitlines()) == 500


@pytest.mark.parametrize("workers", ["1", "2"])
def test_vmpool_api_runs_uvicorn_with_it(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    redis_url: str,
    redis_client: redis.Redis,
    workers: str,
) -> None:
    """Proves: `vmpool api` (as `vmpool up` runs it) hands uvicorn its logging config with
    the batched access handler, at the log level asked for, one worker or several."""
    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.update(options))
    for name in ("VMPOOL_CONFIG", "VMPOOL_REDIS_URL", "VMPOOL_API_HOST"):
        monkeypatch.setenv(name, "")  # the CLI sets them for its workers: restored after
    config = tmp_path / "vmpool.yaml"
    config.write_text(json.dumps(spec_data()))
    args = ["api", "--config", str(config), "--redis-url", redis_url, "--workers", workers]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert served["log_config"] == uvicorn_log_config()
    handler = served["log_config"]["handlers"]["access"]["class"]
    assert handler == "vmpool.api.access_log.BatchedStreamHandler"
    assert served["log_level"] == "info"
