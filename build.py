#!/usr/bin/env python3
"""Compile kernel/kernel.cu to kernel/kernel.ptx with nvcc: `python build.py [--arch compute_XX] [--force]`."""

import sys

from cnnlab.ptx import main

if __name__ == "__main__":
    sys.exit(main())
