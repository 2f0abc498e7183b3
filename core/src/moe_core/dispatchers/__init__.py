"""Core's own token dispatchers (group ``moe.a2a``): ``replicate`` and ``all_to_all``.

Registered through core's own entry points, the door every dispatcher plugin uses (``plugin.py``); the
contract they implement is ``moe_core.dispatch``, the runner that drives them ``moe_core.distributed``.
"""
