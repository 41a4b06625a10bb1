"""cnnlab.files._mapped_guard, compiled from native/mapped_guard.cpp: files mapped into memory and read without a crash
where another process truncates them."""

class MappedFile:
    """MappedFile(fd, length): a file's first bytes mapped read-only, guarded against truncation."""

    def __init__(self, fd: int, length: int) -> None: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...  # its bytes, read-only
    @property
    def faulted(self) -> bool:
        """Whether a page was lost to a truncation (and read as zeros) since the file was mapped."""
    def drop(self, offset: int, length: int, /) -> None:
        """Unmap the whole pages within those bytes from this process; the page cache keeps them."""
