"""The state layer: the key schema, the transition table, the store (the only writer of
state, through its Lua scripts in ``scripts/``), the audit, locks, the clone semaphore,
API tokens and the counters in Redis. Imports only :mod:`vmpool.ids` and the config."""
