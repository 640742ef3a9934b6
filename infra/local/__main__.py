"""``python -m infra.local``: see :mod:`infra.local.bootstrap`."""

import sys

from infra.local.bootstrap import main

sys.exit(main())
