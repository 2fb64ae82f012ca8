"""The store's Lua scripts (data files, loaded by :mod:`vmpool.state.lua`)."""
