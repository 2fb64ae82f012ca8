"""What a Redis refusal is called, as the server and redis-py spell it, against a real
server.

What this proves: a write refused for too few replicas (``min-replicas-to-write`` with
none connected: ``NOREPLICAS``) is named ``no_replicas`` however it reaches vmpool: a
command alone, a pipeline and a transaction. redis-py puts ``Command # 1 (HSET ...) of
pipeline caused error:`` in front of a pipeline's error; the scheduler's schedule write
met exactly that in every planned switch, was not recognised as an outage, and the
scheduler exited.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from vmpool.local.redis_server import free_port
from vmpool.state.redis_health import RedisCondition, classify
from workers.loop import redis_unusable

from sentinelhelp import Node


@pytest.fixture
def lonely_primary(tmp_path: Path) -> Iterator[Node]:
    """A server that asks for a replica before it takes a write, and has none."""
    node = Node("primary", free_port(), tmp_path, ["--save", "", "--min-replicas-to-write", "1"])
    try:
        yield node.start()
    finally:
        node.stop()


def refusal(client: redis.Redis, *, pipeline: bool, transaction: bool) -> redis.ResponseError:
    with pytest.raises(redis.ResponseError) as raised:
        if not pipeline:
            client.hset("vmpool:schedule:scheduler:s1", "at", "1")
        else:
            pipe = client.pipeline(transaction=transaction)
            pipe.hset("vmpool:schedule:scheduler:s1", "at", "1")
            pipe.execute()
    return raised.value


@pytest.mark.parametrize(("pipeline", "transaction"), [(False, False), (True, False), (True, True)])
def test_too_few_replicas_is_named_whatever_redis_py_puts_in_front(
    lonely_primary: Node, pipeline: bool, transaction: bool
) -> None:
    with lonely_primary.client() as client:
        exc = refusal(client, pipeline=pipeline, transaction=transaction)
    assert "NOREPLICAS" in str(exc)
    if pipeline:
        assert str(exc).startswith("Command # 1 (HSET vmpool:schedule:scheduler:s1")
        assert "of pipeline caused error: NOREPLICAS" in str(exc)
    assert classify(exc) is RedisCondition.NO_REPLICAS
    assert redis_unusable(exc) is RedisCondition.NO_REPLICAS  # waited out, not fatal


def test_a_script_error_in_a_pipeline_is_still_no_outage(lonely_primary: Node) -> None:
    """The error after the prefix decides: a script's own error stays unclassified."""
    with lonely_primary.client() as client:
        pipe = client.pipeline(transaction=False)
        pipe.eval("return redis.error_reply('NOREPLICASX not a condition')", 0)
        with pytest.raises(redis.ResponseError) as raised:
            pipe.execute()
    assert "of pipeline caused error" in str(raised.value)
    assert classify(raised.value) is None


def test_a_block_ended_by_a_demotion_is_a_failover(tmp_path: Path) -> None:
    """A worker blocked on its wake-up list (BLPOP) when its primary becomes a replica gets
    ``UNBLOCKED ... instance state changed (master -> replica?)``. It is the failover's
    READ_ONLY, waited out: red before, when the workers of a planned switch stopped on
    it (the chaos soak's restarts)."""
    node = Node("primary", free_port(), tmp_path, ["--save", ""]).start()
    other = Node("other", free_port(), tmp_path, ["--save", ""]).start()
    try:
        with node.client() as blocked, node.client() as admin:
            errors: list[BaseException] = []

            def block() -> None:
                try:
                    blocked.blpop(["rq:queue:vmpool-vms:wake"], timeout=20)
                except redis.RedisError as exc:
                    errors.append(exc)

            thread = threading.Thread(target=block)
            thread.start()
            deadline = time.monotonic() + 10
            while int(admin.info("clients")["blocked_clients"]) == 0:
                assert time.monotonic() < deadline, "the BLPOP never blocked"
                time.sleep(0.01)
            admin.replicaof("127.0.0.1", other.port)
            thread.join(15)
        assert errors and str(errors[0]).startswith("UNBLOCKED"), errors
        assert classify(errors[0]) is RedisCondition.READ_ONLY
        assert redis_unusable(errors[0]) is RedisCondition.READ_ONLY
    finally:
        node.stop()
        other.stop()
