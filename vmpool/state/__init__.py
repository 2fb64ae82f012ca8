"""The state layer: what vmpool keeps in Redis, and how it is read and written.

It holds the key schema, the transition table, the store (the only writer of state,
through its Lua scripts in ``scripts/``), the audit, locks, the clone semaphore, API
tokens and the counters in Redis. Imports only :mod:`vmpool.ids` and the config.
"""
