"""The soak's history checker on made-up histories, so that each check it adds can fail.

What this proves: an acknowledged create or delete that no answered read follows is
``unchecked_ack`` (the soak's claim covers every acknowledged operation, not only the
ones a poll happened to follow), and :func:`acknowledged_checked` counts them; a lost
create and an undone delete are still named.
"""

from __future__ import annotations

from history import Op, acknowledged_checked, check_history


def op(f: str, t0: float, kind: str = "ok", value: str = "") -> Op:
    return Op(rid="r1", f=f, api=0, t0=t0, t1=t0 + 0.1, type=kind, value=value)


def kinds(ops: list[Op]) -> list[str]:
    return [v.kind for v in check_history(ops)]


def test_an_acknowledged_write_no_read_follows_is_unchecked() -> None:
    created = op("create", 1.0)
    assert kinds([created]) == ["unchecked_ack"]
    assert kinds([created, op("read", 2.0, "fail")]) == ["unchecked_ack"]
    assert kinds([created, op("read", 2.0, value="pending")]) == []
    assert acknowledged_checked([created]) == {"create_acknowledged": 1, "create_checked": 0}


def test_a_lost_create_and_an_undone_delete_are_named() -> None:
    assert kinds([op("create", 1.0), op("read", 2.0, value="missing")]) == ["lost_request"]
    deleted = op("delete", 3.0, value="deleted")
    history = [op("create", 1.0), deleted, op("read", 4.0, value="ready")]
    assert kinds(history) == ["deleted_then_live"]
    assert acknowledged_checked(history) == {
        "create_acknowledged": 1, "create_checked": 1,
        "delete_acknowledged": 1, "delete_checked": 1,
    }  # fmt: skip
