"""What a run needs of a backend: the Backend protocol that the CPU and CUDA backends share, Batch (what its compute()
takes) and TextBatching (how a backend that parses CSV itself takes its text); a backend with a device of its own takes
a file's bytes into its device buffers (network.py's ImageBuffer and CsvDoubleBuffer).

Batch joins the three kinds of batch a run reads: images in host memory (network.py's ImageBatch), the input file's
text (files/csv_batch.py's CsvBatch, which the reader makes), and images copied from a file into a backend's device
memory (DeviceBatch). This module stands above them, so that network.py, below files/, needs nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from cnnlab.files.csv_batch import CsvBatch
from cnnlab.network import Cnn, CsvDoubleBuffer, ImageBatch, ImageBuffer, OutputBatch

if TYPE_CHECKING:
    from typing import Self


@dataclass(frozen=True)
class DeviceBatch:
    """The first `count` images of an image buffer, filled from a file or parsed from its text."""

    buffer: ImageBuffer
    count: int

    def __len__(self) -> int:
        return self.count


# What compute() takes: a batch of images, (where csv_text is set) a batch of the input file's text, or (from an image
# buffer the backend made) images in its device memory.
Batch = ImageBatch | CsvBatch | DeviceBatch


@dataclass(frozen=True)
class TextBatching:
    """How a backend that parses CSV itself takes its text: images per compute() call, and per chunk on the device."""

    batch_images: int
    chunk_images: int


class Backend(Protocol):
    """What the command line needs of a backend: the CPU and the CUDA one both provide it."""

    name: str  # "cpu" or "cuda"
    device: str  # what it runs on, in words
    threads: int  # the host threads it runs on, and the input's reader with it
    reads_in_place: bool  # compute() reads any host memory as fast as its own buffers: a mapped file's images go in place

    @property
    def peak_device_bytes(self) -> int:
        """The most device memory its buffers held at once so far (0: no device)."""
        ...

    @property
    def batch_size(self) -> int | None:
        """Images per compute() call that suit this backend; None: the reader's step, which suits it."""
        ...

    @property
    def csv_text(self) -> TextBatching | None:
        """Not None: compute() also takes CSV text (a CsvBatch), parsed on the backend's device."""
        ...

    def allocate_images(self, count: int) -> np.ndarray:
        """A host buffer of shape (count, 100, 100) that compute() reads fastest from."""
        ...

    def free_images(self, buffer: np.ndarray) -> None:
        """Give back a buffer allocate_images() made (a GPU's is page-locked until then, whatever holds the array)."""
        ...

    def image_buffer(self, count: int) -> ImageBuffer | None:
        """An image buffer in the backend's device memory for up to `count` images (as many as suit it: its `capacity`,
        the batch) that a regular file's bytes are copied straight into (a DeviceBatch for compute()), to be freed when
        the run is over; None where there is no such way (the CPU)."""
        ...

    def csv_double_buffer(self, file_bytes: int, images: int) -> CsvDoubleBuffer | None:
        """A double buffer in the backend's device memory that a regular CSV file's text (`file_bytes` of `images`) is
        copied straight into and parsed in (DeviceBatches of its images for compute()), to be freed when the run is
        over; None where there is no such way (the CPU, or where the host parses CSV)."""
        ...

    def allocate_text(self, nbytes: int) -> np.ndarray:
        """A host byte buffer that CSV text for compute() is read into (where csv_text is set)."""
        ...

    def free_text(self, buffer: np.ndarray) -> None:
        """Give back a buffer allocate_text() made."""
        ...

    def load_cnn(self, cnn: Cnn) -> None:
        """Compute with `cnn` from now on (a GPU's weights copied to its device)."""
        ...

    def compute(self, batch: Batch, check_finite: bool = False) -> OutputBatch:
        """The network's outputs for every image of the batch (CSV text only where csv_text is set), in order;
        `check_finite`: an ArrayError where an image holds a NaN or an infinity (for images no parser has checked: a
        .npy file's)."""
        ...

    def close(self) -> None:
        """Free what the backend holds (a GPU's context last)."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc_info: object) -> None: ...
