"""`python -m multicritic`: the `multicritic` command.

Importing the package first runs `backend_default.select()`, which sees that
this process is the command and checks the command line and the backend
(`multicritic.cli.preflight`) before Keras is imported.
"""

from multicritic.cli import main

raise SystemExit(main())
