"""``python -m workflow_streams``: the ``workflow-streams`` command (the image's entry point)."""

from .shells.cli import main

raise SystemExit(main())
