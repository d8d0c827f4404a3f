from multicritic.cli import main

raise SystemExit(main())
