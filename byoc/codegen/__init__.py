"""Codegen shared by all backends: the host code that owns memory and calls the extern
functions in order, and template rendering."""
