#!/usr/bin/env python3
"""The build step, as the lab's build.rs: `python build.py [--arch sm_XX ...] [--force] [--no-ladder]` compiles
kernel/*.cu and kernel/ladder/*.cu to fatbins with nvcc.

`python -m build` typed in this folder finds this file first, as the module `build` (Python puts the current folder at
the head of its path): run so, it hands over to the standard build frontend (pypa's build), which makes the sdist and
the wheel, before importing anything of cnnlab.
"""

import importlib.util
import os
import runpy
import sys


def hand_over_to_the_build_frontend() -> None:
    """Run pypa's `build` as `python -m build` would have, had this folder not been on the path."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    sys.modules.pop("build", None)
    if importlib.util.find_spec("build") is None:
        sys.exit(f"{sys.executable}: No module named build: `python -m build` needs the build frontend (pip install build)")
    runpy.run_module("build", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if __spec__ is not None and __spec__.name == "build":
        hand_over_to_the_build_frontend()
    else:
        from cnnlab.cuda.buildstep import main

        sys.exit(main())
