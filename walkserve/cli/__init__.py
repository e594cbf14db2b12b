"""Command-line entry points (``walkserve ...``)."""
