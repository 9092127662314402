"""How work here is tried again: with tenacity, one backoff, and one rule for what a retry may follow.

tenacity (jd/tenacity, the Python retry library most projects use) runs the loops: its
``AsyncRetrying`` says in one place what is retried, how often and how long to wait, where each hand-rolled
loop said it differently. The supervisor restarts failed background tasks with ``BACKOFF`` too.
"""

from __future__ import annotations

from tenacity import wait_exponential_jitter

from ..store.db import DB_UNAVAILABLE, DatabaseTimeout

# exponential from 0.1 s, capped at 2 s (the longest a waiter lags behind a recovery), with up to 0.1 s of
# jitter so that processes that lost Postgres together do not come back in lockstep
BACKOFF = wait_exponential_jitter(multiplier=0.1, max=2.0, jitter=0.1)


def lost_connection(exc: BaseException) -> bool:
    """A connection was lost before an answer: trying again on another one is right. Not a deadline
    that passed (``DatabaseTimeout``): the caller's time is up, so it gets its answer (a 503) now."""
    return isinstance(exc, DB_UNAVAILABLE) and not isinstance(exc, DatabaseTimeout)
