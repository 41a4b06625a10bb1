"""The CPU backend (the lab's cpu.rs): the network on the host's cores, bit for bit what cpu.rs computes.

backend.py        CpuBackend: the native forward (cnnlab.cpu._forward, native/cpu_forward.cpp) on every core,
                  or the numpy one where no compiler built it
numpy_forward.py  the forward in vectorised numpy: the readable reference, bit for bit the same
"""
