"""``python -m bench.gpu``: see :mod:`bench.gpu.run`."""

from bench.gpu.run import main

raise SystemExit(main())
