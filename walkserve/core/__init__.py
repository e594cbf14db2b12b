"""Shared vocabulary of every layer: ids, arrays, requests, outputs, errors.

Standard library only; every other package may import it.
"""
