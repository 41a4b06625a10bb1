"""What the ladder's launchers need of a CUDA context (DeviceSetup): the device's limits, the weights on the device, and
each rung's module built where stale and loaded on first need."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cnnlab.cuda.nvcc import Build, ensure_fatbin
from cnnlab.errors import DeviceError
from cnnlab.network import Cnn
from cnnlab.tracing import NO_TRACE, Tracer

if TYPE_CHECKING:
    from cnnlab.cuda.driver import DeviceAllocation, Driver, DriverDevice
    from cnnlab.cuda.memory import Allocator


class DeviceSetup:
    """What a launcher needs of the context: the device's limits, the weights on the device, and the
    rungs' modules, each built (where stale) and loaded on first need, with the filters copied into
    its constant memory where it has them; where `trace` records each chunk's spans (--trace-chunks), each kernel's
    launches are spans on their streams."""

    def __init__(
        self, driver: Driver, device: DriverDevice, memory: Allocator, cnn: Cnn, weights: DeviceAllocation, trace: Tracer = NO_TRACE
    ) -> None:
        attribute = driver.device_attribute
        self.driver, self.memory, self.cnn, self.weights, self._trace = driver, memory, cnn, weights, trace
        self.sm_count = device.get_attribute(attribute.MULTIPROCESSOR_COUNT)
        self.capability: tuple[int, int] = device.compute_capability()
        self.shared_per_block = device.get_attribute(attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.shared_per_sm = device.get_attribute(attribute.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
        self._modules: dict[tuple[str, str], Any] = {}
        self._global_filters: Any = None
        self.nonfinite = memory.device(4)  # conv2d_relu's flag (rungs 4 to 7): an image value was a NaN or an infinity

    def module(self, build: Build) -> Any:
        key = (build.source, build.variant)
        if key not in self._modules:
            module = self._trace.per_chunk.launches(self.driver.module_from_file(str(ensure_fatbin(build))))
            self._copy_filters(module)
            self._modules[key] = module
        return self._modules[key]

    def _copy_filters(self, module: Any) -> None:
        """The filters into `module`'s constant memory, where it has them."""
        try:
            symbol = module.get_global("filters")[0]
        except self.driver.Error:  # no such symbol: this source reads its filters from global memory
            return
        self.driver.memcpy_htod(symbol, self.cnn.filters)

    def load_cnn(self, cnn: Cnn) -> None:
        """Compute with `cnn` from now on: its filters into every module loaded and its weights into device memory."""
        self.cnn = cnn
        for module in self._modules.values():
            self._copy_filters(module)
        if self._global_filters is not None:
            self.driver.memcpy_htod(self._global_filters, cnn.filters)
        self.driver.memcpy_htod(self.weights, cnn.weights)

    def add_module(self, build: Build, module: Any) -> None:
        """A module the context loaded itself (kernel.cu's), with its filters already copied in."""
        self._modules[(build.source, build.variant)] = module

    def function(self, build: Build, name: str, signature: str, shared: int = 0) -> Any:
        """A prepared kernel of `build`, allowed `shared` bytes of dynamic shared memory where it needs them."""
        function = self.module(build).get_function(name)
        function.prepare(signature)
        if shared > self.shared_per_block:
            raise DeviceError(f"{name} needs {shared} bytes of shared memory per block; this GPU allows {self.shared_per_block}")
        if shared > 48 * 1024:  # beyond the default, a block gets more only when its kernel asks
            function.set_attribute(self.driver.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
        return function

    def global_filters(self) -> Any:
        """The filters in device memory, for the rungs that read them from there."""
        if self._global_filters is None:
            self._global_filters = self.memory.device(self.cnn.filters.nbytes)
            self.driver.memcpy_htod(self._global_filters, self.cnn.filters)
        return self._global_filters

    def blocks_per_sm(self, threads: int, shared: int) -> int:
        """Resident thread blocks per multiprocessor, as threads and shared memory allow (1 KB a block is the system's)."""
        return max(1, min(2048 // threads, self.shared_per_sm // (shared + 1024) if shared else 2048 // threads))
