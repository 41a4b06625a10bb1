"""cnnlab.cpu._forward, compiled from native/cpu_forward.cpp: the network's forward in C++ on every core, bit for bit cpu.rs's."""

import numpy as np
import numpy.typing as npt

# The native code checks each array's shape, and that it is C-contiguous float64.
Floats = npt.NDArray[np.float64]

ISAS: tuple[str, ...]  # every kernels' name, widest first
CPU_ISAS: tuple[str, ...]  # those this CPU runs, widest first

class Forward:
    """Forward(filters, weights, threads, isa=None): the network's forward on `threads` threads, with the kernels of `isa`
    (one of CPU_ISAS; None: the widest this CPU runs)."""

    def __init__(self, filters: Floats, weights: Floats, threads: int, isa: str | None = None, /) -> None: ...
    @property
    def isa(self) -> str:
        """The instruction set of the kernels in use."""
    @property
    def threads(self) -> int:
        """The threads a call runs on, the caller's among them."""
    def compute(self, images: Floats, out: Floats, check: bool, /) -> int:
        """The outputs of images (n, 100, 100) into out (n, 10); -1, or where `check` is true the index of the first image
        holding a NaN or an infinity."""
    def compute_plain(self, images: Floats, out: Floats, /) -> None:
        """The same outputs by cpu.rs's loops as written, 8 images a vector, in isa's instructions (the bench's peer)."""
    def read(self, values: Floats, /) -> float:
        """The sum of every value, read once on the threads."""
    def close(self) -> None:
        """Stop the threads."""
