"""Run a cnnlab command with some of its sizes set otherwise, to measure what each size buys: the `sizes` stage's sweep.

    python tools/with_sizes.py NAME=BYTES_OR_COUNT [...] -- cuda CNN INPUT OUTPUT [options]

Each NAME is a module-level size of cnnlab's GPU path (TEXT_BUFFER_BYTES, DEFAULT_BUFFER_IMAGES, ...), set in every
cnnlab module that holds it before the command runs in this process; values take a K, M or G suffix (powers of 1024).
"""

from __future__ import annotations

import sys

SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def value(text: str) -> int:
    scale = SUFFIXES.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def main() -> int:
    split = sys.argv.index("--")
    sizes = dict(setting.split("=", 1) for setting in sys.argv[1:split])
    import cnnlab.cuda.context  # noqa: F401  (every module of the GPU path, loaded)

    for name, text in sizes.items():
        holders = [module for key, module in sys.modules.items() if key.startswith("cnnlab") and hasattr(module, name)]
        if not holders:
            sys.exit(f"with_sizes: no cnnlab module holds {name}")
        for module in holders:
            setattr(module, name, value(text))
    from cnnlab.cli.main import main as cli_main

    return cli_main(sys.argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
