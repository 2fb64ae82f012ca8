"""Everything on one machine: the supervisor, the embedded Redis server, the demo."""
