"""An ID as a value an application hands to the ORM: an int, or (``as_string``) the
canonical decimal string JavaScript clients get, from 0 to 2**63-1 (docs/design.md §1.3).
Shared by the SQLAlchemy column type and the Django field."""

from __future__ import annotations

from leafpool.core.config import MAX_ID
from leafpool.core.errors import InvalidArgument


def id_value(field: str, value: object) -> int:
    """``value`` as an ID, or :class:`InvalidArgument` naming ``field`` and the value:
    an int, or a decimal string of ASCII digits with no sign, space or leading zero."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and (
            value == "0" or not value.startswith("0")):
        number = int(value)
    else:
        raise InvalidArgument(field, value, "an ID: an int, or a decimal string of digits "
                              "with no sign or leading zero, from 0 to 2**63-1")
    if not 0 <= number <= MAX_ID:
        raise InvalidArgument(field, value, "an ID from 0 to 2**63-1")
    return number
