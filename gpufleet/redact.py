"""Secrets kept out of what gpufleet prints: logs, status fields, error messages and API
answers. Everything that formats an error from a component holding a secret (the ledger's
database URL, a Slack webhook's URL, a signing key, an SMTP password) passes it through here
first."""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

HIDDEN = "***"
# user:password@ in any URL-looking text
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@\s/]*@")


def url(text: str) -> str:
    """A URL (or a text holding URLs) with each password hidden."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{HIDDEN}@", text)


def secret_parts(value: str) -> list[str]:
    """What of a secret value must never be shown: the whole of it and, for a URL, its
    password, path and query (a Slack webhook's secret is its path)."""
    parts = [value]
    if "://" in value:
        split = urlsplit(value)
        parts += [p for p in (split.password, split.path, split.query) if p and p != "/"]
    return [p for p in parts if len(p) >= 4]  # a short one would blank out common words


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every secret, every part of one (`secret_parts`) and every URL password
    replaced by ***."""
    for part in sorted({p for s in secrets if s for p in secret_parts(s)}, key=len, reverse=True):
        text = text.replace(part, HIDDEN)
    return url(text)
