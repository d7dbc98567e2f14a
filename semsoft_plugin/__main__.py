"""`python -m semsoft_plugin` runs the `semsoft` command line."""

import sys

from semsoft_plugin.app.cli import main

sys.exit(main())
