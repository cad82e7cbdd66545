"""What a path or URL string says: local or remote, a glob or one name, and its printable form.

`redact` is the one place credentials are hidden. Everything that prints, logs, raises or
stores a URL passes it (or the whole message) through `redact`: userinfo becomes `***@` and
every query (and fragment) value becomes `***`, so signed URLs (`X-Goog-Signature=`,
`X-Amz-Signature=`, Azure `sig=`, `token=`, ...) show their parameter names but never their
values. It finds URLs inside any text, so a library's error message that quotes the URL is
redacted as a whole; text without `://` (local paths) is returned as it is.

What is a query: on http(s) a `?` or `#` after the host always starts one (signed URLs are
http(s)). Elsewhere (`gs://b/x?.ar`) `?` is a glob character, unless it starts what looks
like `key=value` with no `/` after it (`s3://b/k?versionId=...`).

The storage libraries we hand URLs to log them whole at DEBUG level (fsspec's HTTP
filesystem logs every signed URL it fetches); `redact_logs` puts a filter on their loggers.
"""

from __future__ import annotations

import logging
import re

__all__ = ["has_glob", "has_query", "is_local", "read_instruction", "redact", "redact_logs"]

_GLOB_CHARS = re.compile(r"[*?\[]")
# A URL inside text: from its scheme to the first space or quote; trailing punctuation of the
# sentence around it (`(see https://h/x.)`) is not taken as part of it.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*[^\s'\"<>`).,;:!]|"
                          r"[A-Za-z][A-Za-z0-9+.-]*://")
_WEB = ("http", "https")
_WEB_QUERY = re.compile(r"[?#]")
# Outside http(s), a `?` starts a query only before `key=...` with no `/` in the rest.
_OTHER_QUERY = re.compile(r"\?(?=[\w.~%+-]+=[^/]*$)")
_QUERY_PART = re.compile(r"([?&;#])([^?&;#]*)")
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*"
_CHAIN = re.compile(rf"::(?={_SCHEME}(?:://|::))")  # where an fsspec chain's next URL starts
_WHOLE_URL = re.compile(rf"{_SCHEME}(?:::{_SCHEME})*://\S*")  # a string that is one URL


def _split(url: str) -> tuple[str, str, str, str]:
    """One URL (no `::` chain) as (scheme://, userinfo@, host/path, ?query#fragment)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", "", url, ""
    slash = rest.find("/")
    authority = rest if slash < 0 else rest[:slash]
    at = authority.rfind("@")
    user, rest = rest[: at + 1], rest[at + 1 :]
    m = (_WEB_QUERY if scheme.lower() in _WEB else _OTHER_QUERY).search(rest)
    cut = m.start() if m else len(rest)
    return scheme + sep, user, rest[:cut], rest[cut:]


def _mask(query: str) -> str:
    """`?a=1&b=2#c` -> `?a=***&b=***#***`: parameter names stay, values never do."""
    def one(m: re.Match) -> str:
        key, eq, value = m.group(2).partition("=")
        if not eq:
            return m.group(1) + ("***" if key else "")
        return f"{m.group(1)}{key}={'***' if value else ''}"
    return _QUERY_PART.sub(one, query)


def _redact_url(url: str) -> str:
    if "::" in url:  # fsspec chains: `simplecache::gs://...`, `zip://a::s3://...`
        parts = _CHAIN.split(url)
        if len(parts) > 1:
            return "::".join(_redact_url(part) for part in parts)
    scheme, user, path, query = _split(url)
    if not scheme:
        return url
    return scheme + ("***@" if user else "") + path + _mask(query)


def redact(text: str) -> str:
    """`text` (a URL, or a message that quotes URLs) with every URL's credentials hidden."""
    if "://" not in text or ("@" not in text and "?" not in text and "#" not in text):
        return text  # no userinfo, no query: nothing to hide (the common case, kept cheap)
    if _WHOLE_URL.fullmatch(text):  # one URL: all of it, quotes or `)` in a password too
        return _redact_url(text)
    return _URL_IN_TEXT.sub(lambda m: _redact_url(m.group()), text)


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


GCS_SCHEMES = ("gs", "gcs")  # gcs:// is gcsfs's alias of gs://


def is_gcs(url: str) -> bool:
    return url.partition("://")[0] in GCS_SCHEMES and "://" in url


def has_glob(pattern: str) -> bool:
    """Whether `pattern` names files by a glob; a URL's query is never part of the glob."""
    return any(_GLOB_CHARS.search(_split(part)[2]) for part in _CHAIN.split(pattern))


def has_query(url: str) -> bool:
    """Whether `url` (or a URL of its fsspec chain) has a query or fragment, as `redact`
    finds them: what `redact` would mask."""
    return any(_split(part)[3] for part in _CHAIN.split(url))


# array_record's and Grain's read instruction: `path[start:end]`, records start..end-1 of one
# file (`ArrayRecordDataSource` matches the same expression, so the same strings mean the same).
_INSTRUCTION = re.compile(r"(.*)\[(\d+):(\d+)\]")


def read_instruction(path: str) -> tuple[str, int, int] | None:
    """`"f.array_record[10:20]"` -> `("f.array_record", 10, 20)`; None if `path` has no
    `[start:end]` suffix. Whether a file of that literal name exists is the opener's
    question (it wins over the instruction)."""
    m = _INSTRUCTION.fullmatch(path)
    return None if m is None else (m.group(1), int(m.group(2)), int(m.group(3)))


class _RedactFilter(logging.Filter):
    """Rewrites a log record's message (and traceback) with its URLs redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        safe = redact(text)
        if safe != text:
            record.msg, record.args = safe, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


_FILTER = _RedactFilter()
# Loggers of the storage libraries that log the URLs they are given.
STORAGE_LOGGERS = ("fsspec", "fsspec.http", "fsspec.cached", "gcsfs", "gcsfs.credentials",
                   "s3fs", "adlfs", "aiohttp.client")


def redact_logs(*names: str) -> None:
    """Redact URLs in what the loggers `names` (default: STORAGE_LOGGERS) log; idempotent.

    A logger's filter sees only what is logged to that logger itself, not to its children,
    so each logger is named. It costs nothing while the logger is below its level.
    """
    for name in names or STORAGE_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
