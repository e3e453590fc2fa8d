import sys

from gnn_ptp.cli import main

sys.exit(main())
