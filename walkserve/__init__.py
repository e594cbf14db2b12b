"""walkserve: a serving system for composite multimodal models.

A model is a Walk Graph (components as nodes, tensors as edges, composed with
Sequential / Parallel / Loop / DynamicLoop and streaming edges); a placement
file says where each node runs; the runtime does batching, caching,
scheduling, streaming and transport for every model alike.
"""

__version__ = "0.1.0"
