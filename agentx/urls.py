"""Server URLs as users type them: checked, normalised, and never shown with credentials."""
from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def normalise_base_url(url: str) -> str:
    """`http(s)://host[:port][/prefix]` without a trailing `/` or `/v1` (we append the API
    paths ourselves; OpenAI SDK users habitually pass `.../v1`). Raises ValueError with a
    message a user can act on."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ValueError("has an invalid port") from None
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def redact_url(url: str | None) -> str | None:
    """The URL with any `user:password@` removed, for logs, errors and result files."""
    if not url:
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, "<redacted>@" + host, parts.path, parts.query,
                       parts.fragment))


def scrub(text: str, url: str | None) -> str:
    """`text` (an exception message, say) with the URL's credentials blanked out."""
    if not url:
        return text
    parts = urlsplit(url)
    if "@" in parts.netloc:
        text = text.replace(parts.netloc.rsplit("@", 1)[0] + "@", "<redacted>@")
    # a bare token (http://TOKEN@host) or a password, wherever else it was echoed; very short
    # ones are left, as blanking them would garble ordinary words
    secret = parts.password or parts.username
    if secret and len(secret) >= 4:
        text = text.replace(secret, "<redacted>")
    return text
