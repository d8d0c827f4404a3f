"""`python -m multicritic`: the `multicritic` command.

Importing the package first sees (`multicritic.backend.selection.cli_argv`) that
this process is the command and checks the command line and the backend
(`multicritic.cli.preflight`) before Keras is imported.
"""

from multicritic.cli import main

raise SystemExit(main())
