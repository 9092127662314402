"""Process services: long-lived objects one serving process runs beside its HTTP handlers.

Wakes (``wakes``, ``listen_notify``), group commit across streams (``group_commit``), shared reads for
subscribers (``reads``). They use the Postgres layer (``store``) and the pure rules (``domain``); the
shells (``api``, ``workers``) use them.
"""
