"""`cnnlab bench`: how fast each path is, against the hardware's bounds and the peers, measured in one run.

rows.py    which rows run
cpu.py     the cpu rows: the forward against the memory bound, the plain loop, numpy and PyTorch
startup.py the start-up rows beside the driver's own start (the floor)
gpu.py     the GPU rows and the ladder's, timed with CUDA events against the copy bounds
gpus.py    what the host feeds 1..N GPUs copying at once (the gpus rows)
text.py    the rows that read CSV text
peers.py   the network in PyTorch and JAX, run in a subprocess each
report.py  the report as types (a Figure per row), its tables, its JSON and its plot
"""
