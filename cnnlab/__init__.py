"""cnnlab: the ECE 459 Lab 3 CNN as a Python package, with a numpy CPU backend and a CUDA one."""

__version__ = "0.1.0"
