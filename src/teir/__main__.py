"""``python -m teir`` runs the command line."""

import sys

from teir.cli.main import main

sys.exit(main())
