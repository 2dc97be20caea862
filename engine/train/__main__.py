"""``python -m engine.train --config job.json --out DIR`` (see :mod:`engine.train.cli`)."""

import sys

from engine.train.cli import main

sys.exit(main())
