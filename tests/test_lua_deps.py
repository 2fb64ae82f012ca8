"""The store's scripts composed with only the helpers their bodies reach (lua_deps.prune).

Proves: the dependency pass keeps exactly the definitions a body reaches, transitively,
in order, resolving each name to the definition in scope where it is used; it refuses a
helper text with a top-level statement it could not cut safely; every composed store
script still compiles in Redis, names no helper it lost, and defines nothing its body
does not reach (the place read too); and a pruned script behaves as the whole one (same
replies, same data).
"""

from __future__ import annotations

import pytest
import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from vmpool.state.lua_deps import definitions, identifiers, prune
from vmpool.state.ops import once_text
from vmpool.state.quotas import QuotaStore
from vmpool.state.records import Slot
from vmpool.state.store import Store
from vmpool.state.store_scripts import POOL_SCRIPTS, REQUEST_SCRIPTS, StoreScripts

from storehelp import ACTOR, make_request, settings

ALL_SCRIPTS = sorted({*REQUEST_SCRIPTS, *POOL_SCRIPTS})

HELPERS = """\
local A = 1
-- b uses A
local function b()
  return A
end
local C = {
  x = b,
}
-- d is never used
local function d()
  return 'b c A'  -- names in a string and a comment: b
end
local function fact(n)
  if n <= 1 then return 1 end
  return n * fact(n - 1)
end
local A = 2
"""


def test_prune_keeps_what_the_body_reaches_transitively_in_order() -> None:
    kept = prune(HELPERS, "return C.x()\n")
    assert [sorted(d.names) for d in definitions(kept)] == [["A"], ["b"], ["C"]]
    assert kept.startswith("local A = 1\n-- b uses A\nlocal function b()")
    assert "local A = 2" not in kept  # b sees the first A; the body never names A


def test_prune_resolves_the_body_to_the_latest_definition_and_keeps_recursion() -> None:
    assert definitions(prune(HELPERS, "return A")) == [definitions(HELPERS)[-1]]
    kept = prune(HELPERS, "return fact(3)")
    assert [sorted(d.names) for d in definitions(kept)] == [["fact"]]


def test_prune_ignores_names_in_comments_and_strings() -> None:
    assert prune(HELPERS, "-- d b\nreturn 'fact'") == ""
    assert identifiers("x.y -- z\n'w' .. \"v\" .. [[u]] --[[ t ]] s") == {"x", "y", "s"}


def test_a_top_level_statement_in_helpers_is_refused() -> None:
    with pytest.raises(ValueError, match=r"redis\.call"):
        definitions("local A = 1\nredis.call('DEL', KEYS[1])\n")
    with pytest.raises(ValueError, match="runs a command"):
        definitions("local N = redis.call('INCR', KEYS[1])\n")
    with pytest.raises(ValueError, match="runs a command"):
        definitions("local T = {\n  x = table.remove(ARGV),\n}\n")


def _split(text: str, name: str) -> tuple[str, str]:
    """A composed store script's helpers, and its body run once (ops.once_text)."""
    body = once_text(read_script("vmpool.state.scripts", f"{name}.lua"))
    assert text.endswith(body)
    return text[: -len(body)], body


def _store_helper_names(scripts: StoreScripts, name: str) -> set[str]:
    whole, _ = _split(scripts.text(name), name)
    return {n for d in definitions(whole) for n in d.names}


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_every_composed_script_compiles_and_names_no_helper_it_lost(
    redis_client: redis.Redis, name: str
) -> None:
    keys = Keys("vmpool")
    pruned, whole = StoreScripts(redis_client, keys), StoreScripts(redis_client, keys, whole=True)
    text = pruned.text(name)
    redis_client.script_load(text)  # a syntax error or over 200 locals fails here
    helpers, body = _split(text, name)
    defined = {n for d in definitions(helpers) for n in d.names}
    # Every name of a whole-composition helper the pruned text uses is defined in it:
    # none would be read as an (undefined) global.
    assert identifiers(text) & _store_helper_names(whole, name) <= defined
    # Nothing kept is unreached: each definition is named by the body or another one.
    kept = definitions(helpers)
    for i, d in enumerate(kept):
        elsewhere = identifiers(body).union(*(identifiers(o.text) for o in kept[i + 1 :]))
        assert d.names & elsewhere, f"{name}: {sorted(d.names)} kept but not reached"
    assert len(text) < len(whole.text(name))


def test_the_place_read_compiles_with_only_the_line_functions_it_reaches(
    redis_client: redis.Redis,
) -> None:
    """request_place.lua (GET /ondemandvm/<id>): the line's functions but the new place."""
    quotas = QuotaStore(redis_client, Keys("vmpool"))
    text = quotas._place.script
    redis_client.script_load(text)
    body = read_script("vmpool.state.scripts", "request_place.lua")
    assert text.endswith(body)
    names = {n for d in definitions(text[: -len(body)]) for n in d.names}
    assert {"line_place", "line_service", "line_wait", "line_number"} <= names
    assert "line_new_place" not in names and "QUOTA_VMS" not in names
    store = Store(redis_client, Keys("vmpool"))
    for rid in ("first", "second"):
        assert store.create_request(rid, [Slot("deb", "debian", 1)], settings(), actor=ACTOR).ok
    assert quotas.place("nosuch", 0) is None
    place = quotas.place("second", 0)
    assert place is not None and place.position == 2 and place.eta_s is not None


def _flow(store: Store, rid: str) -> list[tuple[bool, str, int | None]]:
    """One request through its VM's life, and another that expires: the replies."""
    names = make_request(store, rid, 1, vm_lifetime_s=0)
    out = [
        store.vm_ready(names[0], actor=ACTOR),
        store.create_request(rid, [Slot("deb", "debian", 1)], settings(), actor=ACTOR),
        store.end_vm_lifetime(names[0], actor=ACTOR),
        store.vm_destroyed(names[0], actor=ACTOR),
    ]
    make_request(store, rid + "x", 2, reserve=False, ttl_s=0, grace_s=0)
    out.append(store.expire_request(rid + "x", actor=ACTOR))
    out.append(store.delete_request(rid, actor=ACTOR))
    return [(o.ok, o.code, o.version) for o in out]


def test_pruned_scripts_behave_as_the_whole_ones(redis_client: redis.Redis) -> None:
    pruned, whole = Store(redis_client, Keys("p")), Store(redis_client, Keys("w"))
    whole.scripts = StoreScripts(redis_client, whole.keys, whole=True)
    replies = _flow(pruned, "r1")
    assert replies == _flow(whole, "r1")
    assert [code for _, code, _ in replies] == [
        "fulfilled",
        "exists",
        "completed",
        "destroyed",
        "failed",
        "deleted",
    ]
    for rid in ("r1", "r1x"):
        a, b = pruned.get_request(rid), whole.get_request(rid)
        assert a is not None and b is not None
        assert (a.status, a.version, a.have) == (b.status, b.version, b.have)
        trail = [(e.entity, e.src, e.dst, e.version) for e in pruned.history(rid)]
        assert trail == [(e.entity, e.src, e.dst, e.version) for e in whole.history(rid)]
