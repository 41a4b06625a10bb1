"""The CPU backend (the lab's cpu.rs): the network on every core, bit for bit what cpu.rs computes.

The forward is native (cnnlab.cpu._forward, from native/cpu_forward.cpp: a group of images a vector,
the network's sums in cpu.rs's order) where the install built it, and the numpy forward
(numpy_forward.py, the same bits, ~20x slower) where no compiler did. The native kernels are the
widest this CPU runs, or those CNNLAB_CPU_ISA names (avx512, avx2 or x86-64), to time narrower ones.
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

import numpy as np

from cnnlab.constants import IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE
from cnnlab.errors import UsageError
from cnnlab.extensions import note_missing
from cnnlab.files.text import HostMemory
from cnnlab.network import Cnn, ImageBatch, OutputBatch, default_threads, nonfinite_error, own_pages

if TYPE_CHECKING:
    from cnnlab.backend import Batch
    from cnnlab.cpu import _forward
    from cnnlab.cpu.numpy_forward import NumpyForward

Forward: type[_forward.Forward] | None
try:
    from cnnlab.cpu._forward import CPU_ISAS, ISAS, Forward
except ImportError:  # no C++ compiler at install time: numpy, and a note saying why it is slow
    Forward = None
    ISAS = CPU_ISAS = ()

ISA_VARIABLE = "CNNLAB_CPU_ISA"


def kernel_isa() -> str | None:
    """The instruction set whose kernels CNNLAB_CPU_ISA asks the native forward for; None where it is unset or empty
    (the widest this CPU runs). A UsageError where it names none, kernels this CPU cannot run (never a quiet
    fallback: a timing would say what did not run), or any kernels where the native forward is not built."""
    isa = os.environ.get(ISA_VARIABLE, "")
    if not isa:
        return None
    if Forward is None:
        raise UsageError(f"{ISA_VARIABLE}={isa}: the native forward is not built, so there are no kernels to choose")
    if isa not in ISAS:
        raise UsageError(f"{ISA_VARIABLE}={isa}: not one of {', '.join(ISAS)}")
    if isa not in CPU_ISAS:
        raise UsageError(f"{ISA_VARIABLE}={isa}: this CPU runs only the {', '.join(CPU_ISAS)} kernels")
    return isa


class CpuBackend(HostMemory):
    """The network on `threads` threads (default: every core this process may run on), a batch per compute() call.

    A run's batch is the reader's step where none is asked for: the forward takes ~20 us a call, so a batch need
    only keep the reader efficient (a CSV step of every thread's runs) and may stay in cache (a .npy step)."""

    name = "cpu"
    csv_text = None  # CSV is parsed by the reader, into allocate_images' buffers (its text in HostMemory's windows)
    peak_device_bytes = 0  # no device
    reads_in_place = True  # a .npy file's images are read where the file is mapped: no copy at all

    def __init__(self, cnn: Cnn, batch_size: int | None = None, threads: int | None = None) -> None:
        self.batch_size = batch_size
        self.threads = threads or default_threads()
        self._forward = self._made_forward(cnn)
        self.device = f"{platform.machine() or 'cpu'}, {self.threads} threads, {self._forward.isa}"

    def _made_forward(self, cnn: Cnn) -> _forward.Forward | NumpyForward:
        """The native forward for `cnn` (its weights copied in), or the numpy one where no compiler built it."""
        if Forward is not None:
            return Forward(cnn.filters, cnn.weights, self.threads, kernel_isa())
        from cnnlab.cpu.numpy_forward import NumpyForward  # the fallback, and its thread pool's import, only here

        note_missing("cnnlab.cpu._forward")
        return NumpyForward(cnn.filters, cnn.weights, self.threads)

    def load_cnn(self, cnn: Cnn) -> None:
        made = self._made_forward(cnn)
        self._forward.close()
        self._forward = made

    def allocate_images(self, count: int) -> np.ndarray:
        """A buffer on pages of its own, huge where the kernel gives them: the reader fills it with few faults."""
        return own_pages(count * IMAGE_BYTES, "an image buffer").view(np.float64).reshape(count, INPUT_DIM, INPUT_DIM)

    def free_images(self, buffer: np.ndarray) -> None:
        """Nothing to give back: the pages go with the last array on them."""

    def image_buffer(self, count: int) -> None:
        """None: the CPU has no device memory; a file's images are mapped (reads_in_place) or read into host buffers."""
        return None

    def csv_double_buffer(self, file_bytes: int, images: int) -> None:
        """None: the CPU parses CSV itself, from a mapping of the file."""
        return None

    def compute(self, batch: Batch, check_finite: bool = False) -> OutputBatch:
        """The batch's outputs; `check_finite`: an ArrayError where an image holds a NaN or an infinity."""
        assert isinstance(batch, ImageBatch)  # CSV text comes only to a backend with csv_text set, a DeviceBatch with a device buffer
        outputs = np.empty((len(batch), OUT_LAYER_SIZE))
        if self._forward.compute(batch.images, outputs, check_finite) >= 0:
            raise nonfinite_error("images")
        return OutputBatch(outputs)

    def close(self) -> None:
        self._forward.close()

    def __enter__(self) -> CpuBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
