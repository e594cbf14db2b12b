"""Shared vocabulary of every layer: ids, arrays, requests, outputs, errors.

The standard library and msgspec only; every other package may import it.
"""
