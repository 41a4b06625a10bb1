"""Where cnnlab's own files (the default data, the kernel sources and their fatbins) live, and how it was installed.

In a checkout they are the top-level data/ and kernel/ folders; a `pip install` of a wheel or an
sdist puts them inside the package as cnnlab/data and cnnlab/kernel (setup.cfg maps them there).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def is_checkout() -> bool:
    """Whether cnnlab runs from a checkout (also an editable install), not from an installed package."""
    return not (_PACKAGE / "kernel").is_dir()


def resource_dir(name: str) -> Path:
    """The folder `name` ("data" or "kernel"): inside the installed package, else in the checkout."""
    installed = _PACKAGE / name
    return installed if installed.is_dir() else _PACKAGE.parent / name


def install_command(extra: str) -> str:
    """The command that adds the optional dependencies `extra` to this Python, for the way cnnlab was installed."""
    target = f"{_PACKAGE.parent}[{extra}]" if is_checkout() else f"cnnlab[{extra}]"
    return f"{shlex.quote(sys.executable)} -m pip install {'-e ' if is_checkout() else ''}{shlex.quote(target)}"
