"""Jinja templates (.j2) for generated host code and kernels; one folder per user."""
