"""The network's typed containers (the lab's cnn.rs; its sizes and the glossary of cnnlab's words are constants.py's),
with the two kinds of device memory a file's bytes go straight into: ImageBuffer and CsvDoubleBuffer.

Each container checks shape, dtype and contiguity once, when it is made, so the backends
can trust what they are handed.
"""

from __future__ import annotations

import errno
import mmap
import os
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cnnlab.constants import CONV_LAYER_SIZE, FILTER_DIM, IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.errors import ArrayError, ResourceError, UsageError, byte_size, memory_limit_note

if TYPE_CHECKING:
    import threading

HUGE_PAGES_FROM = 4 << 20  # own_pages asks for huge pages (2 MB) from this size on


# The most threads a run may be asked for: far past any machine's cores, and inside the native pools' C int.
MAX_THREADS = 1 << 16


def default_threads() -> int:
    """The threads cnnlab runs on where none are named: OMP_NUM_THREADS where set (the knob numeric code obeys), else
    every core this process may run on (its affinity mask, as taskset and cgroups set it, not the machine's count)."""
    try:
        threads = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        threads = 0
    if threads > MAX_THREADS:
        raise UsageError(f"OMP_NUM_THREADS={threads}: more than the {MAX_THREADS} threads a run may have")
    return threads if threads > 0 else len(os.sched_getaffinity(0))


def own_pages(nbytes: int, what: str) -> np.ndarray:
    """`nbytes` bytes (uint8) on pages of their own (an anonymous mapping, shared with no other object), huge where the
    kernel gives them: a buffer of hundreds of MB is then a few hundred faults to fill, not a hundred thousand. Where the
    system will not map them, a ResourceError naming `what` they were for and how much was asked."""
    try:
        pages = mmap.mmap(-1, max(nbytes, 1))
    except OSError as error:
        reason = "out of memory" if error.errno == errno.ENOMEM else error.strerror or str(error)
        raise ResourceError(f"{reason}: {what} of {byte_size(nbytes)} cannot be mapped{memory_limit_note()}") from None
    if nbytes >= HUGE_PAGES_FROM and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            pages.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # no transparent huge pages here: ordinary ones
            pass
    return np.frombuffer(pages, np.uint8, nbytes)


# Address space kept free under a limit (ulimit -v) beside what a run plans: numpy's temporaries, the outputs' text, the
# native forward's scratch, and the stacks of the threads a run starts (three a core at most: the parse's, the native
# pool's, the reads'; each as large as the stack limit, 8 MB by default, counts against the address space).
ADDRESS_SPACE_RESERVE = 64 << 20


def fits(nbytes: int, threads: int) -> bool:
    """Whether `nbytes` more can be mapped under the address-space limit (ulimit -v), where one is set, with space to spare
    for a run on `threads` threads (ADDRESS_SPACE_RESERVE)."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return True
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * mmap.PAGESIZE
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack = 8 << 20 if stack == resource.RLIM_INFINITY else stack
    return mapped + nbytes + ADDRESS_SPACE_RESERVE + 3 * threads * stack <= limit


def unsized_capacity(count: int) -> int:
    """The images to buffer at most for an input whose size cannot be known in advance (a pipe): N, but no more
    than a quarter of the machine's memory holds, so that a huge N and --batch are a slower run, not a failed one."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return count
    return max(1, min(count, memory // (4 * IMAGE_BYTES)))


def _checked(name: str, array: np.ndarray, shape: tuple[int | None, ...]) -> np.ndarray:
    """Return `array` if it is a C-contiguous float64 array of `shape` (None: any length >= 1)."""
    if not isinstance(array, np.ndarray) or array.dtype != np.float64:
        raise TypeError(f"{name} must be a float64 numpy array, not {getattr(array, 'dtype', type(array))}")
    if array.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(array.shape, shape)
    ):
        raise ValueError(f"{name} must have shape {shape}, not {array.shape}")
    if array.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one row")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return array


def host_array(name: str, value: Any) -> np.ndarray:
    """`value`, anything numpy reads (a list, a view, Fortran order, any float or integer dtype), as a numpy
    array of real numbers, not yet converted: no copy where numpy needs none."""
    if hasattr(value, "__cuda_array_interface__"):
        raise ArrayError(f"{name} lie in device memory: this takes host arrays (numpy, lists); copy them to the host first")
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as error:  # a ragged list, an object numpy cannot read
        raise ArrayError(f"{name} are not an array of numbers: {error}") from None
    if array.dtype.kind not in "fiu":
        raise ArrayError(f"{name} must hold real numbers (any float or integer dtype, converted to float64), not {array.dtype}")
    return array


def first_nonfinite(array: np.ndarray) -> tuple[int, ...] | None:
    """The index of the first NaN or infinity in `array`, or None where it holds none."""
    # min and max are NaN where a NaN is and infinite where an infinity is: two fast reductions, no temporary.
    if array.size == 0 or (np.isfinite(array.min()) and np.isfinite(array.max())):
        return None
    return tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])


def require_finite(name: str, array: np.ndarray) -> None:
    """Raise an ArrayError naming the first NaN or infinity in `array`, if it holds one."""
    index = first_nonfinite(array)
    if index is not None:
        raise nonfinite_error(name, f"{array[index]} at index {index}")


def nonfinite_error(name: str, what: str = "a NaN or an infinity") -> ArrayError:
    return ArrayError(f"{name} hold {what}: the network takes finite values only")


def real_array(name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    """`value` (see host_array) as a C-ordered float64 array of `shape` with finite values, converted once
    where it is not that already."""
    array = host_array(name, value)
    if array.shape != shape:
        raise ArrayError(f"{name} must have shape {shape}, not {array.shape}")
    array = np.ascontiguousarray(array, dtype=np.float64)
    require_finite(name, array)
    return array


@dataclass(frozen=True)
class Cnn:
    """The network's weights: filters (10, 5, 5) and output weights (10, 4000).

    Built from anything numpy reads (see host_array), converted once to C-ordered float64; a wrong shape
    or a value that is not finite is an ArrayError.

    >>> import numpy as np
    >>> rng = np.random.default_rng(459)
    >>> cnn = Cnn(rng.uniform(-10, 10, (10, 5, 5)).astype(np.float32), rng.uniform(-10, 10, (10, 4000)))
    >>> cnn.filters.dtype, cnn.weights.shape
    (dtype('float64'), (10, 4000))
    """

    filters: np.ndarray
    weights: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "filters", real_array("filters", self.filters, (CONV_LAYER_SIZE, FILTER_DIM, FILTER_DIM)))
        object.__setattr__(self, "weights", real_array("weights", self.weights, (OUT_LAYER_SIZE, OUT_NEURON_DIM)))


@dataclass(frozen=True)
class ImageBatch:
    """A batch of input images, shape (n, 100, 100)."""

    images: np.ndarray

    def __post_init__(self) -> None:
        _checked("images", self.images, (None, INPUT_DIM, INPUT_DIM))

    def __len__(self) -> int:
        return len(self.images)


@dataclass(frozen=True)
class OutputBatch:
    """The network's outputs for a batch, shape (n, 10)."""

    values: np.ndarray

    def __post_init__(self) -> None:
        _checked("outputs", self.values, (None, OUT_LAYER_SIZE))

    def __len__(self) -> int:
        return len(self.values)


class Filling(Protocol):
    """An image buffer's fill under way (ImageBuffer.start_fill)."""

    def wait(self) -> int:
        """Once, and before the buffer is filled again or freed: the bytes copied, once every one is read and its copy
        queued (the buffer's kernels wait for its arrival on the device); a failure of the copy is raised here."""
        ...


class ImageBuffer(Protocol):
    """Device memory for `capacity` images that compute() reads where they lie (a DeviceBatch's): filled straight from a
    file's bytes with no stop in a host buffer of the run's (a backend's image_buffer()), or parsed from CSV text on the
    device (a CsvDoubleBuffer's)."""

    capacity: int

    def start_fill(self, fd: int, offset: int, count: int, stop: threading.Event) -> Filling:
        """Start copying `count` images' bytes of the file `fd` from `offset` into the buffer's first images, while the
        caller goes on; the Filling's wait() gives the bytes copied, fewer where the file ends first. Where `stop` is set
        (the run is ending) the copy stops early and the batch is dropped, whatever the count."""
        ...

    def host_copy(self, count: int) -> np.ndarray:
        """The buffer's first `count` images, copied back to the host: to name the image a compute() refused."""
        ...

    def free(self) -> None:
        """Give the buffer's device memory back (the run that asked for it is over)."""
        ...


class CsvDoubleBuffer(Protocol):
    """Two text buffers in device memory that a regular CSV file's ranges are copied into with no stop in a host buffer,
    and two image buffers they are parsed into there (a backend's csv_double_buffer()): one text buffer fills while the
    other is parsed, one image buffer is parsed into while the other's images are computed."""

    text_bytes: int  # the most text a fill takes
    rows: int  # the most rows a parse takes

    def start_fill(self, fd: int, offset: int, nbytes: int, stop: threading.Event) -> None:
        """Start copying `nbytes` of the file `fd` from `offset` into the next text buffer (two fills may be under way,
        the second's buffer one whose text parsed() has returned), on threads of the backend's, while the caller goes
        on; where `stop` is set (the run is ending) the copy stops early."""
        ...

    def filled(self) -> int:
        """Wait for the oldest fill not yet waited for: the bytes copied, fewer where the file ends first (or where
        `stop` was set)."""
        ...

    def parse(self, nbytes: int, file_row: int, carry: int, separated: bool) -> None:
        """Queue the parse of the oldest filled text buffer (its first `nbytes`, from the file's row `file_row`: a range
        starts just after a row) into an image buffer, after the `carry` rows of an image the last parse left
        unfinished; `separated`: the file has a blank line before every image after the first (files/rows.py)."""
        ...

    def parsed(self, carry: int, path: str | os.PathLike[str]) -> tuple[int, ImageBuffer | None] | None:
        """Wait for the last parse: the rows it found and the image buffer that holds them after the `carry` rows; no
        buffer where the rows were more than `rows` (nothing kept); None where it found a bad row (the file `path`'s
        reader names it)."""
        ...

    def restart(self) -> None:
        """Wait for the fills under way and drop them: the next fill goes into the text buffer the next parse reads."""
        ...

    def free(self) -> None:
        """Give the buffers' device memory back (the run that asked for them is over)."""
        ...
