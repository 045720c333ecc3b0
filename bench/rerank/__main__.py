"""``python -m bench.rerank``: see :mod:`bench.rerank.run`."""

from bench.rerank.run import main

raise SystemExit(main())
