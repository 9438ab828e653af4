"""`python -m byoc ...`: the same command line as the `byoc` script."""
import sys

from .cli import main

sys.exit(main())
