"""The HTTP server: OpenAI-compatible routes, the native NDJSON route, metrics. Torch-free."""

from walkserve.api.app import build_app
from walkserve.api.config import ServerConfig
from walkserve.api.server import serve, serve_async

__all__ = ["ServerConfig", "build_app", "serve", "serve_async"]
