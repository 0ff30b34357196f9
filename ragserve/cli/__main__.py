"""``python -m ragserve.cli``: the ``ragserve`` command."""

import sys

from ragserve.cli.main import main

if __name__ == "__main__":  # importing the module (a test importing every module) runs nothing
    sys.exit(main())
