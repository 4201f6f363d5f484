"""``python -m reports.census``: run the census and print one line per model type (see reports/cli.py)."""

from __future__ import annotations

import sys

from reports.cli import main

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "census", *sys.argv[1:]]
    main()
