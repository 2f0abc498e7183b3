"""SGLang's entry point (group ``sglang.srt.plugins``): ``register`` runs in SGLang's ``load_plugins``, before the
server arguments are parsed and again in every scheduler process, and SGLang applies the hooks it registered
right after. It refuses an SGLang it was not tested against (``versions``) by raising, which SGLang logs with
the sentence, and then registers nothing: ``--moe-runner-backend moe`` is not offered rather than half-hooked.
"""

from __future__ import annotations

from moe_sglang import versions

_registered = False


def register() -> None:
    global _registered
    if _registered:  # SGLang guards load_plugins itself; a second direct call must not wrap twice
        return
    refusal = versions.refusal(versions.installed())
    if refusal is not None:
        raise RuntimeError(refusal)
    from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES, add_moe_runner_backend_choices
    from sglang.srt.layers.moe.moe_runner import register_moe_runner_core
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from moe_sglang import choices, hooks, runner_core

    names = choices.choices()
    add_moe_runner_backend_choices([n for n in names if n not in MOE_RUNNER_BACKEND_CHOICES])
    for name in names:
        try:
            register_moe_runner_core(name, runner_core.factory(name))
        except ValueError as exc:  # registered before in this process (register called twice)
            if "already registered" not in str(exc):
                raise
    for target, hook in hooks.targets():
        HookRegistry.register(target, hook, HookType.AROUND)
    _registered = True
