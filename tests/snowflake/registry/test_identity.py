"""Generator identities (leafpool/snowflake/registry/identity.py): what an identity may be, its
reversible safe form for ZooKeeper node and file names, the identities of worker
processes, and the snowflake name."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import unquote

import pytest

from leafpool.core.config import load_settings
from leafpool.core.errors import ConfigurationError, InvalidArgument
from leafpool.core.setting_values import validate_name
from leafpool.snowflake.registry import default_identity, open_registry, process_identity
from leafpool.snowflake.registry.identity import (
    MAX_IDENTITY_LENGTH,
    safe_identity,
    split_identity,
    validate_identity,
)


@pytest.mark.parametrize(
    "identity,why",
    [
        ("", "non-empty"),
        ("   ", "non-empty"),
        (None, "non-empty"),
        (7, "non-empty"),
        ("x" * (MAX_IDENTITY_LENGTH + 1), f"at most {MAX_IDENTITY_LENGTH}"),
        ("a\nb", "control characters"),
        ("a\x00b", "control characters"),
    ],
)
def test_a_bad_identity_names_the_field_value_and_rule(identity: object, why: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_identity(identity)
    assert err.value.field == "identity" and err.value.value == identity
    assert why in str(err.value)


def test_open_registry_refuses_a_bad_identity_before_anything(tmp_path: Path) -> None:
    settings = load_settings(
        snowflake_mode="local", snowflake_local_map="1", snowflake_cache_dir=str(tmp_path / "cache")
    )
    with pytest.raises(InvalidArgument) as err:
        open_registry(settings, "a\nb")
    assert err.value.field == "identity"
    assert not (tmp_path / "cache").exists()  # nothing written


def test_the_longest_identity_is_allowed() -> None:
    longest = "h:" + "x" * (MAX_IDENTITY_LENGTH - 2)
    assert validate_identity(longest) == longest


@pytest.mark.parametrize(
    "identity",
    [
        "host-a:celery@node-1:0",
        "../../etc/passwd:x:0",
        "h/o/s/t:n:1",
        "naïve:n:2",
        "a%2D:b:3",
        ".",
        "..",
        "100%:n:0",
        "a~b c:n:0",
    ],
)
def test_safe_identity_is_a_reversible_plain_name(identity: str) -> None:
    safe = safe_identity(identity)
    assert "/" not in safe and "-" not in safe and safe not in {".", ".."}
    assert all(c.isascii() and (c.isalnum() or c in "_.:@%") for c in safe)
    assert unquote(safe) == identity  # reversible: distinct identities, distinct names


def test_a_plain_identity_is_its_own_safe_form() -> None:
    assert safe_identity("host_a.example:celery@w1:0") == "host_a.example:celery@w1:0"
    # every other byte of the UTF-8 as %XX: the names in existing trees and cache dirs
    assert safe_identity("host-a:naïve~1/ ") == "host%2Da:na%C3%AFve%7E1%2F%20"
    assert safe_identity("..") == "%2E%2E"


def test_distinct_identities_never_share_a_safe_form() -> None:
    names = ["a-b:n:0", "a_b:n:0", "a%2Db:n:0", "a.b:n:0", "a b:n:0", "a%:n:0", "a%25:n:0"]
    assert len({safe_identity(n) for n in names}) == len(names)


def test_split_identity_is_host_and_the_rest() -> None:
    assert split_identity("host-a:celery@w1:3") == ("host-a", "celery@w1:3")
    assert split_identity("host-only") == ("host-only", "")


def test_process_identity_is_host_node_and_index() -> None:
    assert process_identity("celery@w1", 2, host="h") == "h:celery@w1:2"
    assert process_identity("celery@w1", 0) == f"{socket.gethostname()}:celery@w1:0"
    with pytest.raises(InvalidArgument):
        process_identity("n\n", 0, host="h")


def test_default_identity_names_the_process() -> None:
    assert default_identity() == f"{socket.gethostname()}:pid{os.getpid()}:0"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a:b", "a-b", "naïve", None])
def test_a_bad_snowflake_name_names_the_variable(name: object) -> None:
    with pytest.raises(ConfigurationError) as err:
        validate_name(name)
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_NAME" and err.value.value == name


def test_a_good_snowflake_name() -> None:
    assert validate_name("leafpool_2.prod@eu") == "leafpool_2.prod@eu"
