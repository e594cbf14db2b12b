"""Suite-wide hooks: parity tests may not be skipped on the CPU (``tests/parity_guard.py``)."""

pytest_plugins = ("tests.parity_guard", "pytester")
