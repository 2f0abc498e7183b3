"""Which flashinfer-python releases this backend runs on — decided from package metadata alone.

``import flashinfer`` takes seconds, so the support check reads the installed
version with ``importlib.metadata`` (``moe_core.requirements``) and never
imports it. The history that sets the range (read from every released wheel
0.6.8.post1 ... 0.7.4; see the plugin README):

=====================================  ==========  ==========================================
flashinfer-python                      SM90 W4A16  why it matters
                                       layout
=====================================  ==========  ==========================================
< 0.6.10                               none        no interleaved SM90 MXFP4xBF16 helpers yet
0.6.10 ... 0.6.15.post1                v1          PR #3084 kernel: in-place TMA-descriptor
                                                   update races with scale loads (issue #5438)
0.6.16, 0.6.16.post1, 0.6.16.post2     v2          PR #3738 first landing, withdrawn after a
                                                   crash report (reverted by PRs #4411/#4412)
0.6.16.post3, 0.6.16.post4, 0.6.17     v1          the reverted #3084 kernel again (#5438 race)
0.6.18 ... 0.7.4                       v2          #3738 re-landed and fixed: supported
0.8                                    ?           announced return-type changes; untested
=====================================  ==========  ==========================================

v1 scales: ``[E, K/128, rows*4]``; v2 scales: ``[E, rows/64, K/128, 16, 16]``;
the weight interleave differs too. Weights prepared for one family are wrong
for the other, and the kernel checks neither, so the family is established
twice (here from the version, at bind time from the installed helper's
actual output) and the backend refuses to run when the two disagree.
"""

from __future__ import annotations

from packaging.version import Version

from moe_core import requirements
from moe_core.fused_op import Support

DISTRIBUTION = "flashinfer-python"
#: the versions this backend accepts (also the pyproject dependency)
SUPPORTED = ">=0.6.18,<0.8"

#: SM90 W4A16 layout families (see the module docstring)
LAYOUT_V1 = "v1"
LAYOUT_V2 = "v2"

_V = Version
_WHY = "for the SM90 CUTLASS / SM100 trtllm-gen MXFP4 MoE kernels"


def installed() -> Version | None:
    """The installed flashinfer-python version from metadata (None if absent); imports nothing."""
    return requirements.distribution_version(DISTRIBUTION)


def sm90_layout_family(version: Version) -> str | None:
    """The SM90 W4A16 weight/scale layout family a flashinfer-python version ships (None: no helpers)."""
    if version < _V("0.6.10"):
        return None
    if version < _V("0.6.16"):
        return LAYOUT_V1
    if version < _V("0.6.16.post3"):
        return LAYOUT_V2
    if version < _V("0.6.18"):
        return LAYOUT_V1
    return LAYOUT_V2


def known_problem(version: Version) -> str | None:
    """Why a version outside the range is refused, when there is more to say than "out of range"."""
    if version < _V("0.6.10"):
        return "it predates FlashInfer's SM90 MXFP4xBF16 (W4A16) CUTLASS MoE layout helpers (added in 0.6.10)"
    if version < _V("0.6.16") or _V("0.6.16.post3") <= version < _V("0.6.18"):
        return (
            "its SM90 MXFP4 W4A16 CUTLASS MoE kernel rewrites TMA descriptors in place while scale loads are in "
            "flight and sporadically writes wrong tiles (flashinfer issue #5438: nondeterministic, wrong "
            "output); 0.6.18 ships the fixed kernel"
        )
    if version < _V("0.6.16.post3"):
        return (
            "0.6.16 to 0.6.16.post2 carry the first landing of the SM90 W4A16 kernel rewrite (PR #3738), "
            "withdrawn in 0.6.16.post3/0.6.17 after a crash report (flashinfer PRs #4411/#4412) and re-landed "
            "fixed in 0.6.18"
        )
    if version >= _V("0.8.dev0"):
        return (
            "0.8 is untested: FlashInfer announced return-type changes of its fused-MoE entry points for 0.8, "
            "and the SM90 W4A16 layouts changed three times between 0.6.10 and 0.6.18"
        )
    return None


def check() -> Support:
    """Whether the installed flashinfer-python is one this backend runs on (metadata only)."""
    version = installed()
    if version is None:
        return requirements.require_distribution(DISTRIBUTION, SUPPORTED, why=_WHY)
    problem = known_problem(version)
    if problem:
        return Support.no(
            f"{DISTRIBUTION} {version} is installed, but {problem}; this backend supports "
            f"{DISTRIBUTION}{SUPPORTED}: pip install '{DISTRIBUTION}{SUPPORTED}'"
        )
    support = requirements.require_distribution(DISTRIBUTION, SUPPORTED, why=_WHY)
    if support and sm90_layout_family(version) != LAYOUT_V2:  # cannot happen inside the range; fail closed
        return Support.no(f"{DISTRIBUTION} {version}: SM90 W4A16 layout family unknown for this version")
    return support
