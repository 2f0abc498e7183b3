"""Cheap facts a support check may look at, without importing heavy modules.

A backend's ``probe`` must not import its kernel library (``import flashinfer``
takes seconds); it reads the installed version from distribution metadata and
compares it with a ``packaging`` specifier instead. The answer is a
``Support`` whose reason names the distribution, the installed version and
the accepted range.
"""

from __future__ import annotations

import importlib.metadata as metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from moe_core.filters import env_flag  # noqa: F401  (plugins read their switches with it)
from moe_core.fused_op import Support


def distribution_version(name: str) -> Version | None:
    """The installed version of distribution ``name`` (None if not installed)."""
    try:
        return Version(metadata.version(name))
    except metadata.PackageNotFoundError:
        return None
    except InvalidVersion:
        return None


def require_distribution(name: str, specifier: str = "", why: str = "") -> Support:
    """``Support.yes()`` if ``name`` is installed within ``specifier``, else the reason."""
    version = distribution_version(name)
    purpose = f" ({why})" if why else ""
    if version is None:
        wanted = f"'{name}{specifier}'" if specifier else name
        return Support.no(f"{name} is not installed{purpose}: pip install {wanted}")
    if specifier and not SpecifierSet(specifier).contains(version, prereleases=True):
        return Support.no(f"{name} {version} is installed, but this backend supports {name}{specifier}{purpose}")
    return Support.yes()
