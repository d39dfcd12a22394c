"""`python -m memchat.cli`: the `memchat` command."""

import sys

from memchat.cli import main

sys.exit(main())
