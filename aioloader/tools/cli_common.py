"""What the CLI's commands share: storage options from the command line (whose values are
never printed: they can be tokens), a progress bar that shows only on a terminal, and the
argument words argparse would misread (`--range -2:`). Light to import: `aioloader --version`
loads this and nothing of the runtime.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = ["Progress", "fix_negative_values", "scrub", "storage_options"]

# An option whose value may start with "-" (a negative slice): argparse takes `-2:` for an
# option of its own, so `--range -2:` is joined into `--range=-2:` before parsing.
_NEGATIVE_VALUE = re.compile(r"-\d*:-?\d*|-\d+")
_TAKES_NEGATIVE = ("--range",)


def fix_negative_values(argv: Sequence[str]) -> list[str]:
    """`argv` with `--range -2:` written `--range=-2:` (what argparse reads as one)."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if word in _TAKES_NEGATIVE:
            value = next(words, None)
            if value is not None and value.startswith("-") and _NEGATIVE_VALUE.fullmatch(value):
                out.append(f"{word}={value}")
                continue
            out.append(word)
            if value is not None:
                out.append(value)
            continue
        out.append(word)
    return out


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """The storage options `--storage-options FILE.json` and `--storage-option KEY=VALUE`
    give (the latter win), for fsspec/gcsfs. A VALUE is read as JSON where it is JSON
    (`true`, `30`, `{"a": 1}`, `"quoted"`), else it is the text as given. Errors name the
    file or the key, never a value."""
    options: dict[str, Any] = {}
    path = getattr(args, "storage_options_file", None)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                loaded = json.load(f)
        except ValueError as exc:  # the position only: the text may hold a token
            line = getattr(exc, "lineno", None)
            raise argparse.ArgumentTypeError(
                f"--storage-options {path}: not JSON" + (f" (line {line})" if line else "")
            ) from None
        except OSError as exc:
            raise argparse.ArgumentTypeError(
                f"--storage-options {path}: {exc.strerror or 'cannot be read'}") from None
        if not isinstance(loaded, dict):
            raise argparse.ArgumentTypeError(f"--storage-options {path}: holds "
                                             f"{type(loaded).__name__}, not a JSON object")
        options.update(loaded)
    for k, item in enumerate(getattr(args, "storage_option", None) or (), 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(
                f"--storage-option takes KEY=VALUE; the {_nth(k)} one has no KEY= "
                "(its text is not shown: it may be a secret)")
        options[key.strip()] = _value(value)
    return options


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _nth(k: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(k, f"{k}th")


def scrub(text: str, options: Mapping[str, Any]) -> str:
    """`text` with every storage option's value (as text, and each string inside it) shown
    as `<KEY>`: an error from a filesystem may quote what it was given."""
    for key, value in options.items():
        for shown in _texts(value):
            if len(shown) >= 3:
                text = text.replace(shown, f"<{key}>")
    return text


def _texts(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [str(value), *(t for v in value.values() for t in _texts(v))]
    if isinstance(value, (list, tuple)):
        return [str(value), *(t for v in value for t in _texts(v))]
    if isinstance(value, str):  # as given, as JSON, and as a URL quotes it
        return [value, json.dumps(value), quote(value, safe=""), quote_plus(value),
                quote(value)]
    return [str(value)]


class Progress:
    """A tqdm bar on stderr, only when stderr is a terminal (a log gets no `\\r` lines), made
    on the first update (an error before any progress follows no empty bar) and cleared, not
    left, when the command fails."""

    def __init__(self, desc: str, quiet: bool = False) -> None:
        self.desc = desc
        self.shown = not quiet and _is_terminal(sys.stderr)
        self._bar: Any = None

    def update(self, total: int, postfix: str | None = None) -> None:
        """The count so far is `total` (and `postfix` beside it)."""
        if not self.shown:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(unit=" rec", unit_scale=True, desc=self.desc, dynamic_ncols=True)
        self._bar.update(total - self._bar.n)
        if postfix is not None:
            self._bar.set_postfix_str(postfix, refresh=False)

    def close(self, ok: bool = True) -> None:
        if self._bar is not None:
            self._bar.leave = ok
            self._bar.close()
            self._bar = None


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
