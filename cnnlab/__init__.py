"""cnnlab: the ECE 459 Lab 3 CNN as a Python package, with a native CPU backend (numpy where no
compiler built it) and a CUDA one.

From Python (the README's "From Python"), in a checkout, whose data/ holds the default data:

>>> import cnnlab
>>> cnn = cnnlab.load_cnn("data/cnn.csv")
>>> outputs = cnnlab.forward(cnnlab.load_images("data/in.csv"), cnn)  # device="cuda" for the GPU
>>> outputs.shape, outputs.dtype
((4, 10), dtype('float64'))

The public names are imported on first use, so that `import cnnlab` costs nothing until one is
used: `python -m cnnlab cuda` starts the CUDA driver while numpy is imported, not after.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name and the module that defines it.
_HOMES = {
    "load_cnn": "cnnlab.api",
    "load_images": "cnnlab.api",
    "load_image_batches": "cnnlab.api",
    "forward": "cnnlab.api",
    "release_backends": "cnnlab.owner",
    "Cnn": "cnnlab.network",
    "CudaContext": "cnnlab.cuda.context",
    "CnnlabError": "cnnlab.errors",
    "ArrayError": "cnnlab.errors",
    "InputFileError": "cnnlab.errors",
    "DeviceError": "cnnlab.errors",
    "UsageError": "cnnlab.errors",
}
__all__ = ["__version__", *_HOMES]

if TYPE_CHECKING:  # what type checkers and editors read: the same names, as explicit re-exports
    from cnnlab.api import forward as forward
    from cnnlab.api import load_cnn as load_cnn
    from cnnlab.api import load_image_batches as load_image_batches
    from cnnlab.api import load_images as load_images
    from cnnlab.cuda.context import CudaContext as CudaContext
    from cnnlab.errors import ArrayError as ArrayError
    from cnnlab.errors import CnnlabError as CnnlabError
    from cnnlab.errors import DeviceError as DeviceError
    from cnnlab.errors import InputFileError as InputFileError
    from cnnlab.errors import UsageError as UsageError
    from cnnlab.network import Cnn as Cnn
    from cnnlab.owner import release_backends as release_backends


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cnnlab' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
