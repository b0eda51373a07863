"""``python -m rlf_serve``: the same as the ``rlf-serve`` command."""

import sys

from rlf_serve.app import main

sys.exit(main())
