"""Lets `uv run apps/dare train ...` (Python running this folder) reach the dare CLI."""

import sys

from dare.entry import main

if __name__ == "__main__":
    sys.exit(main())
