#!/usr/bin/env python3
"""Compile kernel/*.cu to fatbins with nvcc: `python build.py [--arch sm_XX ...] [--force]`."""

import sys

from cnnlab.cuda.buildstep import main

if __name__ == "__main__":
    sys.exit(main())
