"""A package pip installs in a sandbox imports at once, in the kernel already running.

The image's root, its venv included, is read-only, so a plain ``pip install``
installs for the user, under ``PYTHONUSERBASE`` in the workspace (the venv
sees user sites). Python puts that directory on ``sys.path`` only if it
exists at start, and remembers a missing directory as one never to look in
again: the first install would import only after a restart. Imported by a
``.pth`` file in the venv, this puts it there from the start, with a finder
that notices when it appears.
"""

import os
import site
import sys
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    ExtensionFileLoader,
    FileFinder,
    SourceFileLoader,
    SourcelessFileLoader,
)

LOADERS = (
    (ExtensionFileLoader, EXTENSION_SUFFIXES),
    (SourceFileLoader, SOURCE_SUFFIXES),
    (SourcelessFileLoader, BYTECODE_SUFFIXES),
)


def watch_user_site() -> None:
    """Put the user site on ``sys.path`` even while missing, with a finder for it."""
    path = site.getusersitepackages()
    enabled = site.ENABLE_USER_SITE
    if enabled is None:  # Debian's site reads a venv's .pth files before deciding
        enabled = site.check_enableusersite()
    if not enabled or os.path.isdir(path) or path in sys.path:
        return  # off, or there at start: site adds it, and its finder sees new files

    def finder(entry: str) -> FileFinder:
        if entry != path:
            raise ImportError("only the user site", path=entry)
        return FileFinder(entry, *LOADERS)  # an absent directory is read again once made

    sys.path_hooks.insert(0, finder)
    sys.path.append(path)  # after the venv's packages, as site orders them


watch_user_site()
