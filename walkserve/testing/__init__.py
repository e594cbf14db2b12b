"""Test support: the reference executor (the semantic oracle), fixture models, fakes."""
