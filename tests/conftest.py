"""Suite-wide hooks: parity tests may not be skipped on the CPU (``tests/parity_guard.py``); tests that
start processes are the slow tier (``tests/tiers.py``)."""

pytest_plugins = ("tests.parity_guard", "tests.tiers", "pytester")
