"""Core's own ``torch`` backend: the float32 reference every other backend is checked against."""
