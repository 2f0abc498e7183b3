"""Backends shipped inside moe-core (registered through core's own entry point)."""
