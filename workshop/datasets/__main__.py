"""`python -m workshop.datasets mnist DIR [--source auto|full|subset]`: prepare a data source's channels."""

import sys

from workshop.datasets.mnist import main

if __name__ == "__main__":
    sys.exit(main())
