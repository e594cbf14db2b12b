"""Python SDK for a walkserve server: ``Client`` (sync) and ``AsyncClient`` (asyncio), both on httpx."""

from walkserve.client.async_client import AsyncClient
from walkserve.client.errors import APIError
from walkserve.client.sync_client import Client

__all__ = ["APIError", "AsyncClient", "Client"]
