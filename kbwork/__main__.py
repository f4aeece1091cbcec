"""``python -m kbwork``: the ``kbwork`` command (:mod:`kbwork.cli`)."""

from .cli import main

raise SystemExit(main())
