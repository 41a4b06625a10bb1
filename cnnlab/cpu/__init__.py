"""The CPU backend (the lab's cpu.rs): the network on the host's cores, bit for bit what cpu.rs computes.

backend.py  CpuBackend: the forward in vectorised numpy over passes of a batch, a thread per core
"""
