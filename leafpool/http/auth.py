"""Token auth (optional, tinyid style), applying ``Settings.token_policy``
(``LEAFPOOL_HTTP_TOKENS="tokenA=order,pay;tokenB=*"``: each token and the tags it may take
IDs of). When set, every ``/api/*`` request needs ``?token=`` or the header
``X-Leafpool-Token``: 401 without a known token, 403 for a tag the token may not use.
The operator pages are not token-protected: bind the service to an internal network."""

from __future__ import annotations

from starlette.requests import Request

from leafpool.core.config import TokenPolicy
from leafpool.http.errors import HttpError

TOKEN_HEADER = "X-Leafpool-Token"


class Auth:
    def __init__(self, policy: TokenPolicy) -> None:
        self.policy = policy

    def allowed_tags(self, request: Request) -> frozenset[str] | None:
        """The tags the request's token may see (None: all). Raises 401."""
        if not self.policy.enabled:
            return None
        token = request.query_params.get("token") or request.headers.get(TOKEN_HEADER)
        if not token:
            raise HttpError(401, "unauthorized",
                            f"a token is required: ?token=... or the {TOKEN_HEADER} header")
        known, tags = self.policy.lookup(token)
        if not known:
            raise HttpError(401, "unauthorized", "unknown token")
        return tags

    @staticmethod
    def authorize(tag: str, allowed: frozenset[str] | None) -> None:
        """403 unless ``allowed`` (from :meth:`allowed_tags`) includes ``tag``."""
        if allowed is not None and tag not in allowed:
            raise HttpError(403, "forbidden", f"this token may not take IDs of tag {tag!r}")
