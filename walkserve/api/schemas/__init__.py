"""Pydantic request models of every route; they are also the OpenAPI schema clients (and fuzzers) see."""
