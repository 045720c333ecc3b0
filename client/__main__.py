"""``python -m client``: see :mod:`client.cli`."""

from .cli import main

raise SystemExit(main())
