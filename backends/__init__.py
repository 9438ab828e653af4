"""Backends: one folder each; importing a folder registers that backend."""
