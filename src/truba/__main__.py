"""``python -m truba``: the same as the ``truba`` command."""

import sys

from truba.cli import main

sys.exit(main())
