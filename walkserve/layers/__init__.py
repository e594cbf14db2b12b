"""Shared neural-network building blocks (torch): norms, rotary embeddings, attention, MLPs, MoE, sampling."""
