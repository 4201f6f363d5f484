"""``python -m reports.bench [smoke|short|full] [cpu|cuda]``: the one-shot device script."""

import sys

from reports.bench.suite import format_table, run_suite

print(format_table(run_suite(*(sys.argv[1:3] or ["short"]))))
