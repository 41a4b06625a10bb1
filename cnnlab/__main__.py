"""`python -m cnnlab` and the `cnnlab` command: the command line (cnnlab.cli)."""

import sys

from cnnlab.driverstart import start_driver


def main() -> int:
    # cuda mode: the driver starts while numpy is imported and the CNN read, before cli is even imported.
    starting = start_driver() if sys.argv[1:2] == ["cuda"] else None
    try:
        from cnnlab.cli import main as cli_main

        return cli_main()
    finally:
        if starting is not None:
            starting.join()


if __name__ == "__main__":
    sys.exit(main())
