"""Where cnnlab's own files (the default data, the kernel source and its PTX) live.

In a checkout they are the top-level data/ and kernel/ folders; a `pip install` puts them inside
the package as cnnlab/data and cnnlab/kernel (setup.cfg maps them there).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """The folder `name` ("data" or "kernel"): inside the installed package, else in the checkout."""
    installed = _PACKAGE / name
    return installed if installed.is_dir() else _PACKAGE.parent / name
