"""The CUDA driver: started early on a thread of its own, imported through PyCUDA, and its errors as one-line DeviceErrors.

Nothing here imports numpy or PyCUDA at module level: `python -m cnnlab cuda` imports this before numpy,
so that cuInit and the primary context (~0.2 s on the H100 and H200 machines, about as much as importing numpy) run on
a thread while numpy is imported. Called through ctypes they run with the GIL released; PyCUDA then
finds the driver started and the primary context made, and CudaContext retains it in a moment.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cnnlab.cuda.gpus import number, nvml_memory, show_only
from cnnlab.errors import ArrayError, DeviceError, DeviceLostError, byte_size, memory_limit_note

if TYPE_CHECKING:
    from cnnlab.arrays import DeviceArray


# PyCUDA has no types of its own: the parts of pycuda.driver that cnnlab calls, as import_driver() gives them. Streams,
# events, modules and their functions stay untyped (Any), as PyCUDA leaves them.
class DriverContext(Protocol):
    """A pycuda.driver.Context: a GPU's context, made current on the calling thread by push() and no longer by pop()."""

    def push(self) -> None: ...

    def pop(self) -> None: ...

    def detach(self) -> None: ...


class DriverDevice(Protocol):
    """A pycuda.driver.Device: one GPU."""

    def name(self) -> str: ...

    def compute_capability(self) -> tuple[int, int]: ...

    def get_attribute(self, attribute: Any) -> int: ...

    def retain_primary_context(self) -> DriverContext: ...

    def pci_bus_id(self) -> str: ...


class DeviceAllocation(Protocol):
    """A pycuda.driver.DeviceAllocation: device memory; int() is its address."""

    def __int__(self) -> int: ...

    def free(self) -> None: ...


class DeviceClass(Protocol):
    """pycuda.driver.Device, the class: a GPU by its index, and how many there are."""

    def __call__(self, ordinal: int) -> DriverDevice: ...

    def count(self) -> int: ...


class ContextClass(Protocol):
    """pycuda.driver.Context, the class: the calling thread's current context."""

    def get_current(self) -> DriverContext | None: ...

    def synchronize(self) -> None: ...


class Driver(Protocol):
    """The module pycuda.driver."""

    Error: type[Exception]
    Device: DeviceClass
    Context: ContextClass
    Stream: Any
    Event: Any
    event_flags: Any
    device_attribute: Any
    function_attribute: Any

    def init(self, flags: int = 0) -> None: ...

    def module_from_file(self, path: str) -> Any: ...

    def mem_alloc(self, nbytes: int) -> DeviceAllocation: ...

    def mem_get_address_range(self, address: int) -> tuple[int, int]: ...

    def mem_get_info(self) -> tuple[int, int]: ...

    def memset_d32(self, target: Any, value: int, count: int) -> None: ...

    def memcpy_htod(self, target: Any, source: Any) -> None: ...

    def memcpy_dtoh(self, target: Any, source: Any) -> None: ...

    def memcpy_htod_async(self, target: Any, source: Any, stream: Any = None) -> None: ...

    def memcpy_dtoh_async(self, target: Any, source: Any, stream: Any = None) -> None: ...

    def memcpy_dtod_async(self, target: Any, source: Any, nbytes: int, stream: Any = None) -> None: ...

    def memset_d8_async(self, target: Any, value: int, count: int, stream: Any = None) -> None: ...

    def pagelocked_empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any: ...


def _start(ordinals: list[int] | None) -> None:
    """cuInit, then the primary context of each GPU of `ordinals` (None: every GPU the driver sees), all at once, a
    thread each; or nothing where there is no driver: cuda mode says so later, in one line. The contexts retained
    here are released by the process's end (a CudaContext keeps its own reference)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    count = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return
    wanted = sorted({ordinal for ordinal in (range(count.value) if ordinals is None else ordinals) if 0 <= ordinal < count.value})
    others = [threading.Thread(target=_retain, args=(cuda, ordinal), name=f"cnnlab-cuda-start-{ordinal}") for ordinal in wanted[1:]]
    for thread in others:
        thread.start()
    if wanted:
        _retain(cuda, wanted[0])
    for thread in others:
        thread.join()


def _retain(cuda: ctypes.CDLL, ordinal: int) -> None:
    device, context = ctypes.c_int(), ctypes.c_void_p()
    if cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0:
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)


# A context's hardware queues, where the user has not set CUDA_DEVICE_MAX_CONNECTIONS (default 8): the driver makes
# them with the context, whose cost grows with their number, while cnnlab cuda's loops ran as fast with 2 as with 8
# and slower with 1 (docs/gpu.md, "Sizes").
CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
QUEUES = 2
Environment = TypeVar("Environment", bound=MutableMapping[str, str])


def few_queues(environment: Environment) -> Environment:
    """Before cuInit: QUEUES hardware queues a context where `environment` sets none (the user's choice is kept)."""
    environment.setdefault(CONNECTIONS, str(QUEUES))
    return environment


def start_driver(gpus: list[int] | None = None) -> threading.Thread:
    """Start the driver and the GPUs numbered `gpus` (None: every GPU) in the background, the driver shown only those
    and each context given QUEUES hardware queues where the user has not chosen (gpus.show_only, few_queues); join the
    thread before the process ends."""
    ordinals = None if gpus is None else show_only(gpus)
    few_queues(os.environ)
    thread = threading.Thread(target=_start, args=(ordinals,), name="cnnlab-cuda-start", daemon=True)
    thread.start()
    return thread


def pointer_device(address: int) -> int | None:
    """The GPU whose memory holds `address` (the driver's unified addresses say so in any context), or None where it
    is not device memory the driver knows."""
    cuda = ctypes.CDLL("libcuda.so.1")
    ordinal = ctypes.c_int()
    pointer_attribute_device_ordinal = 9  # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    result = cuda.cuPointerGetAttribute(ctypes.byref(ordinal), pointer_attribute_device_ordinal, ctypes.c_uint64(address))
    return ordinal.value if result == 0 else None


def check_device_memory(driver: Driver, array: DeviceArray, what: str, device: int) -> None:
    """An ArrayError unless `array` lies wholly in one allocation of GPU `device`'s memory (the user's number): a kernel
    that read elsewhere would fault and lose the context."""
    holder = pointer_device(array.address)
    holder = None if holder is None else number(holder)
    if holder is not None and holder != device:
        raise ArrayError(
            f"{what} lie on GPU {holder}, and this context computes on GPU {device}: use device='cuda:{holder}' "
            f"(CudaContext(cnn, device={holder})), or copy them to GPU {device}"
        )
    try:
        base, size = driver.mem_get_address_range(array.address)
    except driver.Error:
        raise ArrayError(
            f"{what} at {array.address:#x} is not device memory of GPU {device}'s primary context, which cnnlab uses"
        ) from None
    if array.address + array.nbytes > int(base) + size:
        raise ArrayError(f"{what} ({array.nbytes} bytes at {array.address:#x}) run past the end of their allocation")


def retain_context(driver: Driver, gpu: DriverDevice, gpu_number: int, need: int) -> DriverContext:
    """GPU `gpu`'s primary context (the user's GPU `gpu_number`), made current; where the driver has no memory for it, a
    one-line DeviceError naming the GPU, the memory it has free (NVML's count: no context needed) and `need`, the bytes
    a run needs besides its context."""
    try:
        context = gpu.retain_primary_context()
    except driver.Error as error:
        if "out of memory" not in str(error):
            raise
        memory = nvml_memory(gpu.pci_bus_id())
        free = "" if memory is None else f", with {byte_size(memory[0])} of its {byte_size(memory[1])} free"
        raise DeviceError(
            f"cannot start CUDA on GPU {gpu_number} ({gpu.name()}): no memory for its context{free}; "
            f"a run needs the context and at least {byte_size(need)} more"
        ) from None
    context.push()
    return context


def check_free_memory(driver: Driver, gpu: DriverDevice, gpu_number: int, need: int) -> None:
    """A one-line DeviceError where the current context's GPU has less than `need` bytes free, naming the GPU (`gpu_number`)."""
    free, total = driver.mem_get_info()
    if free < need:
        raise DeviceError(
            f"GPU {gpu_number} ({gpu.name()}) has {byte_size(free)} of its {byte_size(total)} memory free once cnnlab's context is "
            f"made; a run needs at least {byte_size(need)}"
        )


def import_driver() -> Driver:
    """pycuda.driver, or a one-line DeviceError saying what is missing."""
    try:
        import pycuda.driver as driver
    except ModuleNotFoundError:
        from cnnlab.resources import install_command

        hint = f"{install_command('cuda')} (builds PyCUDA from source: needs the CUDA toolkit)"
        raise DeviceError(f"the GPU path needs pycuda: {hint}") from None
    except ImportError as error:  # pycuda is there but the driver library is not, or cannot be mapped (ulimit -v)
        note = memory_limit_note() if "failed to map" in str(error) else ""
        raise DeviceError(f"no CUDA driver: {error}{note}") from None
    return driver  # the module, untyped to the checker: Driver says what of it cnnlab uses


FORKED = (
    "cannot start CUDA in a process forked from one where cnnlab had started it (the driver does not carry over a "
    "fork): start GPU workers with multiprocessing's 'spawn' or 'forkserver' method"
)
_STARTED_IN: int | None = None  # the process where visible_count started the driver; a child forked from it cannot


def refuse_a_forked_child() -> None:
    """A one-line DeviceError in a child forked from a process where cnnlab started the driver (CudaContext asks first,
    before the driver is asked)."""
    if _STARTED_IN not in (None, os.getpid()):
        raise DeviceError(FORKED)


def visible_count(driver: Driver) -> int:
    """Start the driver (where it has not started); how many GPUs it sees."""
    global _STARTED_IN
    with device_errors("cannot start CUDA"):
        driver.init()
        _STARTED_IN = _STARTED_IN or os.getpid()
        return driver.Device.count()


@contextmanager
def device_errors(what: str) -> Iterator[None]:
    """Turn the driver's exceptions into a one-line DeviceError saying what was being done."""
    driver = import_driver()
    try:
        yield
    except driver.Error as error:
        detail = " ".join(str(error).split())
        if "out of memory" in detail:  # the driver reserves far more address space than it uses
            detail += memory_limit_note()
        raise (DeviceLostError if context_lost(driver) else DeviceError)(f"{what}: {detail}") from None


def context_lost(driver: Driver) -> bool:
    """Whether the current context has hit an error it cannot recover from (every later call fails)."""
    if driver.Context.get_current() is None:
        return False
    try:
        driver.Context.synchronize()
    except driver.Error:
        return True
    return False


def synchronize_stream(handle: int) -> None:
    """Wait for the work queued on a stream that another library made (a device array's producer, which
    `__cuda_array_interface__` names as a driver handle: 1 and 2 are the default streams). PyCUDA wraps
    only streams it made, so the driver's own call."""
    synchronize = ctypes.CDLL("libcuda.so.1").cuStreamSynchronize
    synchronize.argtypes = [ctypes.c_void_p]
    checked(synchronize(handle), f"cannot wait for the device array's stream {handle:#x}: cuStreamSynchronize")


def checked(result: int, call: str, error: type[Exception] = DeviceError) -> None:
    """A driver call's result through ctypes (the GIL released while it ran), where it failed, as `error` naming the
    call and the driver's words for the result."""
    if result:
        text = ctypes.c_char_p()
        ctypes.CDLL("libcuda.so.1").cuGetErrorString(result, ctypes.byref(text))
        raise error(f"{call} failed: {(text.value or b'CUDA error %d' % result).decode()}")
