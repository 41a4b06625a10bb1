"""The native extensions the install compiles (setup.py), and the one line that says which are missing and what it costs.

Each is optional: where no C++17 compiler built one, its Python or numpy twin gives the same results, more slowly. The
install says so once (setup.py as it builds; the Makefile, which hides pip's output, after it: `python -m
cnnlab.extensions`), and so does a run that needs a missing one, in the same line, made here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable

# Each extension: what it is, and what its twin costs where it is missing.
EXTENSIONS = {
    "cnnlab.files._lab_csv": ("CSV parser", "CSV parsing ~50x"),
    "cnnlab.cpu._forward": ("CPU forward", "the forward ~20x"),
    "cnnlab.files._mapped_guard": (".npy mapping guard", ".npy inputs read, not mapped"),
}


def missing_extensions() -> list[str]:
    """The extensions that cannot be imported: those the install did not build."""
    missing = []
    for name in EXTENSIONS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def fallback_note(missing: Iterable[str]) -> str:
    """The one line for the extensions `missing`: what they are, what to install, what their twins cost."""
    missing = set(missing)
    names = [name for name in EXTENSIONS if name in missing]
    things, costs = [EXTENSIONS[name][0] for name in names], [EXTENSIONS[name][1] for name in names]
    return (
        f"cnnlab: note: the native {_listed(things)} {'is' if len(names) == 1 else 'are'} not built: install a C++17 "
        f"compiler (g++ >= 11) and reinstall cnnlab; until then Python and numpy give the same results, slower "
        f"({'; '.join(costs)})"
    )


_noted = False


def note_missing(name: str) -> None:
    """The note on stderr, once a process (a run that lacks the parser and the forward says so once): `name`, the
    extension its caller found missing, and any other the install did not build."""
    global _noted
    if not _noted:
        _noted = True
        print(fallback_note([name, *missing_extensions()]), file=sys.stderr)


if __name__ == "__main__":  # the Makefile's install, after pip (which shows none of setup.py's output)
    if missing := missing_extensions():
        print(fallback_note(missing), file=sys.stderr)
