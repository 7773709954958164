from rnntrain.cli import main

raise SystemExit(main())
