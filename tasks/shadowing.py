"""A clear error when an app's own module hides one of agentstate's top-level packages.

agentstate's packages are ``tasks``, ``state`` and ``config``. Run from a folder that
holds a ``config.py`` or ``state.py`` (the script's folder is first on ``sys.path``, and
``celery`` puts the current folder there too), Python imports that module in place of
ours, and the first error would read ``cannot import name 'Settings' from 'config'``.
``tasks/__init__.py`` runs :func:`check_packages` before it imports anything else, so
the error says what happened instead. A ``tasks.py`` hides this very package, so none of
our code runs to explain it: docs/guides/agents.md ("Module names") shows Python's message for it.

Only the standard library is used: the packages checked may be the wrong ones.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# Where this installation's top-level packages live, side by side.
ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("config", "state")


def check_packages(names: tuple[str, ...] = CHECKED, root: Path = ROOT) -> None:
    """Raise ImportError naming the module that hides one of ``names``, if one does."""
    for name in names:
        found = _origin(name)
        if found is None or Path(found).resolve() != root / name / "__init__.py":
            # A plain ImportError: agentstate's own error classes live in ``state``,
            # which may be the package that is hidden.
            raise ImportError(explain(name, found, root), name=name)


def explain(name: str, found: str | None, root: Path = ROOT) -> str:
    """One line: what hides agentstate's package ``name``, and what to do about it."""
    ours = root / name
    if found is None:
        return f"agentstate's package {name!r} is missing (expected at {ours})"
    return (
        f"{found} hides agentstate's package {name!r} ({ours}): an app module named "
        f"{name!r} comes first on sys.path. Rename it or move it into your app's package "
        "(docs/guides/agents.md: Module names)"
    )


def _origin(name: str) -> str | None:
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None
