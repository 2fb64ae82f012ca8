"""vmpool: an on-demand VM pool manager whose state cannot be corrupted by concurrency."""

__version__ = "0.1.0"
