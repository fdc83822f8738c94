"""Key names: the public, documented layout (a compatibility promise)."""

from __future__ import annotations

from leafpool.core.keys import Keys


def test_a_tags_keys_share_one_cluster_hash_tag() -> None:
    k = Keys("leafpool").tag("order")
    assert k.ids == "leafpool:{order}:ids"
    assert k.all() == ["leafpool:{order}:ids", "leafpool:{order}:reserve",
                       "leafpool:{order}:state", "leafpool:{order}:lock",
                       "leafpool:{order}:queued", "leafpool:{order}:hits"]
    assert {key.split("{")[1].split("}")[0] for key in k.all()} == {"order"}


def test_global_keys_follow_the_prefix() -> None:
    k = Keys("ids")
    assert (k.tags, k.wanted, k.beat_lock) == ("ids:tags", "ids:wanted", "ids:beat:lock")
    assert k.sweep_lock == "ids:sweep:lock"
    assert k.tag_of(k.sweep_lock) is None  # the drop watcher takes it for no tag
    assert k.tag("pay").state == "ids:{pay}:state"
