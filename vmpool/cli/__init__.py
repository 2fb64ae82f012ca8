"""The ``vmpool`` command line (click)."""
