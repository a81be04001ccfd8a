"""API authentication: ``Authorization: Token <key>`` for clients, the session for the pages.

Only a key's sha256 is stored; the key itself is shown once, when it is made. Session-authenticated
writes must carry the CSRF token (the pages' fetches send ``X-CSRFToken``); token-authenticated
requests carry no cookie, so they need none.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone

from drafting.models import ApiToken

TOKEN_BYTES = 32  # 256 bits of randomness per key
TOKEN_PREFIX_CHARS = 8  # shown in lists so a person can tell keys apart
TOKEN_NAME_MAX = 80
TOKEN_SCHEME = "token"


class AuthError(Exception):
    """The request carries credentials that do not identify anybody (answered with 401)."""


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def api_token_create(*, user: Any, name: str) -> tuple[ApiToken, str]:
    """A new token for ``user``: (row, key). The key is not stored and cannot be shown again."""
    from drafting.services import UserError

    name = (name or "").strip()
    if not name:
        raise UserError("Give the token a name.", errors={"name": "Name is required."})
    if len(name) > TOKEN_NAME_MAX:
        raise UserError(
            "The name is too long.", errors={"name": f"At most {TOKEN_NAME_MAX} characters."}
        )
    key = secrets.token_urlsafe(TOKEN_BYTES)
    token = ApiToken.objects.create(
        user=user, name=name, prefix=key[:TOKEN_PREFIX_CHARS], key_sha256=_digest(key)
    )
    return token, key


def api_token_revoke(*, user: Any, token_id: int) -> bool:
    """Delete one of the user's own tokens; False when they hold no token with that id."""
    deleted, _ = ApiToken.objects.filter(user=user, pk=token_id).delete()
    return deleted > 0


def api_token_list_for_user(*, user: Any) -> list[ApiToken]:
    return list(ApiToken.objects.filter(user=user))


def user_from_authorization(header: str) -> AbstractBaseUser:
    """The active user a ``Token <key>`` header names; AuthError otherwise."""
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != TOKEN_SCHEME or not key.strip():
        raise AuthError("use the header 'Authorization: Token <key>'")
    token = (
        ApiToken.objects.select_related("user").filter(key_sha256=_digest(key.strip())).first()
    )
    if token is None or not token.user.is_active:
        raise AuthError("the API token is not valid")
    ApiToken.objects.filter(pk=token.pk).update(last_used=timezone.now())
    user: AbstractBaseUser = token.user
    return user


class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request: HttpRequest, reason: str) -> HttpResponse:
        return HttpResponse(reason, status=403)


def _no_response(request: HttpRequest) -> HttpResponse:  # pragma: no cover - never called
    raise AssertionError("the CSRF check never calls the next handler")


def csrf_failure_reason(request: HttpRequest) -> str | None:
    """Why a session-authenticated write fails the CSRF check (None when it passes)."""
    check = _CsrfCheck(_no_response)
    check.process_request(request)
    response = check.process_view(request, _no_response, (), {})
    if response is None:
        return None
    return response.content.decode(errors="replace") or "CSRF check failed"
