"""Old module names that still import, for one release, as the moved module itself.

``install({old: new}, why)`` makes ``import old`` (and ``from package import old``) return the
module ``new`` (the same object: attributes and monkeypatches are shared), and the first import
of each old name warn with a DeprecationWarning naming the new one, at the importing line.
Used by the deprecated ``training`` package of this one (the modules it had) and by
``agentrl_jax/__init__.py`` (the launch code that moved to ``launch/``, and modules that moved
down a layer: ``agentrl_jax.experiments.stats``).

The aliases are made by an import hook, not by a file per old name: a file left at a moved
file's path would stop git from following the move when merging edits made to the old path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from collections.abc import Mapping


def _importer(skip: tuple[str, ...]) -> types.FrameType | None:
    """The frame of the code that imported an old name (past ``skip``'s files and importlib's)."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename in skip or "importlib" in frame.f_code.co_filename
    ):
        frame = frame.f_back
    return frame


class Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports each old name of ``moved`` (``{old module: new module}``) as the new, warning
    once; ``why`` ends the warning; frames of the files in ``skip`` are not the importer."""

    def __init__(self, moved: Mapping[str, str], why: str, skip: tuple[str, ...] = ()):
        self.moved, self.why, self.skip = moved, why, (__file__, *skip)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        new = self.moved[module.__name__]
        message = (
            f"{module.__name__} is deprecated and will be removed in the next release: import "
            f"{new} ({self.why})"
        )
        frame = _importer(self.skip)
        if frame is None:
            warnings.warn(message, DeprecationWarning, stacklevel=2)
        else:
            warnings.warn_explicit(
                message,
                DeprecationWarning,
                frame.f_code.co_filename,
                frame.f_lineno,
                module=frame.f_globals.get("__name__", "<unknown>"),
                registry=frame.f_globals.setdefault("__warningregistry__", {}),
            )
        # The import system returns what sys.modules holds once this returns: the new module.
        sys.modules[module.__name__] = importlib.import_module(new)


def install(moved: Mapping[str, str], why: str, skip: tuple[str, ...] = ()) -> None:
    """Adds the aliases of ``moved`` to the import system (once, however often it is called).

    First in ``sys.meta_path``: an old name is the new module even where a stale file is left at
    its old path (an older install, or another checkout's editable install).
    """
    if not any(isinstance(f, Aliases) and f.moved == moved for f in sys.meta_path):
        sys.meta_path.insert(0, Aliases(moved, why, skip))
