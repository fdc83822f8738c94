"""How many replicas a pop waits for (docs/design.md §7.1): the pure rules of
:mod:`leafpool.redis.replicas` (the real sentinels and cluster: tests/redis/test_replicas.py)."""

from __future__ import annotations

import logging

import pytest
import redis

from leafpool.core.errors import BackendUnavailable, ConfigurationError
from leafpool.redis.replicas import Group, known_by_sentinels, known_in_cluster, need


def test_all_counts_the_known_replicas_not_the_connected_ones() -> None:
    assert need("all", Group(known=2, connected=1, source="the sentinels know")) == 2
    assert need("all", Group(known=0, connected=2, source="the master reports connected")) == 2


def test_a_number_above_what_the_group_knows_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"LEAFPOOL_POP_REPLICAS=3 .*the 2 replica"):
        need(3, Group(known=2, connected=2, source="the sentinels know"))


def test_fewer_than_every_replica_is_allowed_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert need(1, Group(known=2, connected=2, source="the sentinels know")) == 1
    assert "can be promoted after a sequence of failures" in caplog.text


def test_a_replica_away_at_start_is_waited_for_not_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert need(2, Group(known=2, connected=0, source="the sentinels know")) == 2
    assert "0 of the 2 replica(s) a pop needs are connected now" in caplog.text


def test_the_sentinels_count_is_the_most_any_answering_sentinel_knows() -> None:
    one, two = [{"name": "a"}], [{"name": "a"}, {"name": "b"}]
    assert known_by_sentinels([one, redis.ConnectionError("down"), two]) == 2
    with pytest.raises(BackendUnavailable, match="no sentinel answered"):
        known_by_sentinels([redis.ConnectionError("down")])


def test_a_cluster_counts_the_fewest_replicas_of_a_master_failed_ones_included() -> None:
    nodes = {
        "h:1": {"node_id": "m1", "flags": "myself,master", "master_id": "-", "slots": [["0", "9"]]},
        "h:2": {"node_id": "m2", "flags": "master", "master_id": "-", "slots": [["10", "19"]]},
        "h:3": {"node_id": "r1", "flags": "slave", "master_id": "m1", "slots": []},
        "h:4": {"node_id": "r2", "flags": "slave,fail", "master_id": "m1", "slots": []},
        "h:5": {"node_id": "r3", "flags": "slave", "master_id": "m2", "slots": []},
        "h:6": {"node_id": "r4", "flags": "slave", "master_id": "m2", "slots": []},
        "h:7": {"node_id": "old", "flags": "master,fail", "master_id": "-", "slots": []},
    }
    assert known_in_cluster(nodes) == 2
