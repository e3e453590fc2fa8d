"""``gnn-ptp sweep`` on the SYNTHETIC dataset in a process of its own (the PostgreSQL test's workers).

Usage: python tests/sweep_worker.py sweep --data DIR --trials N --storage URL ...  (the CLI's arguments)
"""

import sys

import synthetic_data

from gnn_ptp import cli

if __name__ == "__main__":
    synthetic_data.install()  # made-up graphs instead of tracing
    sys.exit(cli.main(sys.argv[1:]))
