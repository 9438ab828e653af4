"""Shipped YAML build configurations."""
