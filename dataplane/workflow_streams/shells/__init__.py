"""The outermost layer: what starts processes and wires the rest together.

``cli`` (the ``workflow-streams`` command), ``serving`` (``serve``: the worker processes), ``devserver``
(``dev``: the whole product on one machine) and ``compose`` (the composition root: a data plane's pools,
wake hub, live reads and background workers around the HTTP application). Nothing imports a shell but
another shell.
"""
