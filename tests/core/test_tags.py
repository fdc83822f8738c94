import pytest

from leafpool.core.errors import InvalidInput, InvalidTag
from leafpool.core.tags import MAX_TAG_LENGTH, validate_tag


@pytest.mark.parametrize("tag", ["order", "a", "pay.v2", "user-id_01", "x" * MAX_TAG_LENGTH])
def test_valid_tags_pass_unchanged(tag: str) -> None:
    assert validate_tag(tag) == tag


def test_empty_tag_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidTag, match=r"tag='' is not valid: must not be empty"):
        validate_tag("")


def test_tag_over_128_characters_is_refused_with_its_length() -> None:
    with pytest.raises(InvalidTag, match="129 characters long; at most 128"):
        validate_tag("x" * 129)


@pytest.mark.parametrize("tag,bad", [("a b", " "), ("{order}", "{}"), ("a:b", ":"),
                                     ("naïve", "ï"), ("x/y", "/")])
def test_characters_outside_the_set_are_named(tag: str, bad: str) -> None:
    with pytest.raises(InvalidTag) as info:
        validate_tag(tag)
    assert repr(bad) in str(info.value)
    assert "A-Z a-z 0-9 _ . -" in str(info.value)
    assert isinstance(info.value, InvalidInput)
