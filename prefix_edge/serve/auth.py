"""Who may call the server, and whose caches a call may see.

Keys: none (a desktop on loopback: every call one user), `--api-key KEY` (one key, one tenant,
"default"), or `--api-keys FILE`: one `KEY TENANT` pair a line (blank lines and `#` comments
skipped; a key is any run of non-blank characters, a tenant a name of letters, digits, `-`,
`_`, `.`, `@`); several keys may share a tenant. Every /v1/ route, and /metrics unless
`--metrics-public`, needs `Authorization: Bearer KEY` (401 otherwise); /health stays open (a
liveness probe learns nothing but a count of tasks and requests).

Tenants exist to keep the shared caches from telling one client what another sent (the class
of vLLM's CVE-2025-46570): a prompt-cache hit or a composed document is faster than a miss, and
`usage.prompt_tokens_details.cached_tokens` counts it, so a client could learn whether anyone
sent a given system prompt or document. A call's `cache_scope` (runtime/prepare.py) is its
tenant, and within it the request's `prompt_cache_key` (OpenAI's field: a client may partition
its own users further): entries of another scope are never hit. With no keys or one key, every
call is one tenant and the caches are shared as before (prompt_cache_key still partitions).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
from pathlib import Path

from ..errors import PrefixEdgeError, warn

DEFAULT_TENANT = "default"
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")


class Keys:
    """The API keys a server takes, each to its tenant. Looked up by the key's SHA-256 and
    compared in constant time, so a wrong key's timing says nothing of a right one."""

    def __init__(self, pairs: dict[str, str]):
        self._by_hash = {hashlib.sha256(k.encode()).digest(): t for k, t in pairs.items()}
        self.tenants = sorted(set(pairs.values()))

    @classmethod
    def single(cls, key: str) -> "Keys":
        if not key or any(c.isspace() for c in key):
            raise PrefixEdgeError("--api-key must be a non-empty key without spaces")
        return cls({key: DEFAULT_TENANT})

    @classmethod
    def from_file(cls, path: str | Path) -> "Keys":
        """`KEY TENANT` lines; any malformed line is a one-line error naming file and line."""
        path = Path(path)
        try:
            st = os.stat(path)
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise PrefixEdgeError(f"--api-keys {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
        pairs: dict[str, str] = {}
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise PrefixEdgeError(f"--api-keys {path}:{n}: expected `KEY TENANT`, got {len(parts)} field(s)")
            key, tenant = parts
            if not _TENANT.fullmatch(tenant):
                raise PrefixEdgeError(f"--api-keys {path}:{n}: tenant {tenant[:40]!r} is not a name (letters, "
                                      "digits, '-', '_', '.', '@'; at most 128)")
            if key in pairs:
                raise PrefixEdgeError(f"--api-keys {path}:{n}: this key is on an earlier line too")
            pairs[key] = tenant
        if not pairs:
            raise PrefixEdgeError(f"--api-keys {path}: no `KEY TENANT` line")
        if hasattr(os, "getuid") and stat.S_IMODE(st.st_mode) & 0o077:
            warn(f"--api-keys {path}: readable by other users (chmod 600 it)")
        return cls(pairs)

    def tenant(self, authorization: bytes) -> str | None:
        """The tenant of an `Authorization: Bearer KEY` header value, or None."""
        scheme, _, key = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not key:
            return None
        digest = hashlib.sha256(key.strip()).digest()
        found = None
        for h, t in self._by_hash.items():  # every entry compared: the time does not depend on which
            if hmac.compare_digest(h, digest):
                found = t
        return found


class BearerAuth:
    """ASGI: `Authorization: Bearer KEY` required on /v1/* (and /metrics unless public); the
    caller's tenant put in the request's state (`request.state.tenant`). A plain ASGI wrapper:
    BaseHTTPMiddleware would re-buffer streamed responses."""

    def __init__(self, app, keys: Keys, metrics_public: bool, refuse):
        self.app, self.keys, self.metrics_public, self.refuse = app, keys, metrics_public, refuse

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope["path"]
            guarded = path.startswith("/v1/") or (path == "/metrics" and not self.metrics_public)
            if guarded:
                got = dict(scope.get("headers") or []).get(b"authorization", b"")
                tenant = self.keys.tenant(got)
                if tenant is None:
                    return await self.refuse(scope, receive, send)
                scope.setdefault("state", {})["tenant"] = tenant
        return await self.app(scope, receive, send)


def tenant_of(request) -> str | None:
    """The caller's tenant (None: the server takes no keys)."""
    state = request.scope.get("state") or {}
    return state.get("tenant")


MAX_PROMPT_CACHE_KEY = 1024  # characters


def cache_scope(tenant: str | None, prompt_cache_key) -> str | None:
    """A call's cache scope: its tenant, then its prompt_cache_key (None: shared); a key over
    MAX_PROMPT_CACHE_KEY characters is a 400 naming it."""
    if tenant is None and not prompt_cache_key:
        return None
    key = ""
    if prompt_cache_key:
        if len(prompt_cache_key) > MAX_PROMPT_CACHE_KEY:
            from .schema import ApiError

            raise ApiError(400, f"`prompt_cache_key` is {len(prompt_cache_key)} characters; at most "
                                f"{MAX_PROMPT_CACHE_KEY}", "prompt_cache_key")
        key = hashlib.sha256(prompt_cache_key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{tenant or ''}\x1f{key}"
