"""Unread usage in SQL: the one writing of ``domain.credit.base_sequence`` for queries over many streams.

Unread starts after the slowest consumer's ack; pruned records are no longer unread; with no consumer
registered every retained record is unread. Queries that compute backlog (the metrics sampler) or a
stream's credit base in SQL build it from these fragments instead of writing the formula again;
``tests/test_unread_rule.py`` holds this writing and the domain's to the same answers.
"""

from __future__ import annotations


def base_sequence(min_ack: str, earliest_sequence: str) -> str:
    """SQL for ``domain.credit.base_sequence(min_ack, earliest_sequence)`` over two SQL expressions."""
    return f"greatest(coalesce({min_ack}, 0), {earliest_sequence} - 1)"


def unread_items(stream: str = "s", min_ack: str = "m.min_ack") -> str:
    """SQL for a stream's unread record count (``credit.Usage.unread_items``), from the ``wfs_streams``
    row aliased ``stream`` and the slowest ack (``MIN_ACK`` joined as ``m``)."""
    return f"({stream}.last_sequence - {base_sequence(min_ack, f'{stream}.earliest_sequence')})"


# The slowest consumer's ack of the stream aliased ``s``, as ``m.min_ack`` (NULL: no consumer). A lateral
# join on wfs_consumers' (run_id, stream_id) index: no pass over every consumer of every stream.
MIN_ACK = """LEFT JOIN LATERAL (
    SELECT min(c.acked_sequence) AS min_ack FROM wfs_consumers c
    WHERE c.run_id = s.run_id AND c.stream_id = s.stream_id
) m ON true"""
