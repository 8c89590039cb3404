"""Subcommands of `realsim` (one module each)."""
