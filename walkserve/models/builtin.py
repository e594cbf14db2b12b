"""Registers the model families that ship with walkserve (imports nothing heavy)."""

from walkserve.models.registry import register

register("llama", "walkserve.models.llama.model:build")
register("qwen2", "walkserve.models.llama.model:build")
register("qwen3", "walkserve.models.llama.model:build")
register("orpheus", "walkserve.models.orpheus.model:build")

# fixture families (fake components) for tests, demos of the graph and benchmarks
import walkserve.testing.fixtures  # noqa: E402, F401
