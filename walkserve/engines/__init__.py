"""Engines run the nodes of one component on one rank: KV-cache, stateless, null."""
