"""Test helpers shipped with moe-core, for core's tests and plugin authors'.

- ``moe_core.testing.distributions``: write real (metadata-only) distributions
  into a folder, to test discovery and loading of entry points.
- ``moe_core.testing.conformance``: the conformance suite a backend's tests
  subclass.
- ``moe_core.testing.counting``: count a fused op's forwards (an integration's proof
  that the engine's layer ran through moe).
"""
