"""``python -m rlf_studio``: the same as the ``rlf-studio`` command."""

import sys

from rlf_studio.cli import main

if __name__ == "__main__":
    sys.exit(main())
