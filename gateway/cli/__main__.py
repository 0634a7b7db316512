"""``python -m gateway.cli``: the ``sbx`` command."""

import sys

from .main import main

sys.exit(main())
