"""`python -m multicritic.cli`: the `multicritic` command, as `python -m multicritic`."""

from multicritic.cli import main

raise SystemExit(main())
