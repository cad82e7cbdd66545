"""The writer options string, as ArrayRecord stores it in the footer.

Parsing follows array_record's `Options::FromString`; formatting reproduces its canonical
order, which Grain's `ArrayRecordDataSource` regex-parses (`group_size:(\\d+),`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .codecs import BROTLI, NONE, SNAPPY, ZSTD, Compression

_LEVELS = {ZSTD: (-131072, 22, 3), BROTLI: (0, 11, 6)}
_WINDOWS = {ZSTD: (10, 31), BROTLI: (10, 30)}
_CODECS = {"zstd": ZSTD, "brotli": BROTLI, "snappy": SNAPPY, "uncompressed": NONE}


@dataclass(frozen=True)
class WriterOptions:
    """What a writer was asked to do; `compression` decides the chunk codec."""

    group_size: int = 1
    compression: Compression = field(default_factory=Compression)
    transpose: bool = False
    pad_to_block_boundary: bool = False
    max_parallelism: int | None = 1

    def to_string(self) -> str:
        parts = [
            f"group_size:{self.group_size}",
            f"transpose:{str(self.transpose).lower()}",
            f"pad_to_block_boundary:{str(self.pad_to_block_boundary).lower()}",
        ]
        c = self.compression
        if c.codec in _LEVELS:
            parts.append(f"{c.name}:{c.level}")
            window = c.window_log if c.window_log is not None else (20 if c.codec == ZSTD
                                                                     else None)
            if window is not None:
                parts.append(f"window_log:{window}")
        else:
            parts.append(c.name)
        if self.max_parallelism is not None:
            parts.append(f"max_parallelism:{self.max_parallelism}")
        return ",".join(parts)


def _int(key: str, value: str | None, lo: int, hi: int) -> int:
    try:
        n = int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"option {key!r} needs an integer, got {value!r}") from None
    if not lo <= n <= hi:
        raise ValueError(f"option {key}:{n} is out of range [{lo}, {hi}]")
    return n


def _bool(key: str, value: str | None) -> bool:
    if value in (None, "true"):
        return True
    if value == "false":
        return False
    raise ValueError(f"option {key!r} takes true or false, got {value!r}")


def parse_options(text: str) -> WriterOptions:
    """Parse `group_size:1,zstd:3,...`; raise ValueError naming the bad option."""
    group_size = 1
    codec: int | None = None
    level: int | None = None
    window: int | None = None
    transpose = pad = False
    parallelism: int | None = None
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = item.partition(":")
        val = value if _ else None
        if key == "default":
            continue
        if key == "group_size":
            group_size = _int(key, val, 1, 2**31 - 1)
        elif key in _CODECS:
            if codec is not None:
                raise ValueError(f"conflicting compression options in {text!r}")
            codec = _CODECS[key]
            if codec in _LEVELS:
                lo, hi, default = _LEVELS[codec]
                level = default if val is None else _int(key, val, lo, hi)
            elif codec == SNAPPY and val not in (None, "1", "2"):
                raise ValueError(f"snappy takes no level, got {val!r}")
            elif codec == NONE and val is not None:
                raise ValueError("uncompressed takes no value")
        elif key == "window_log":
            window = None if val == "auto" else _int(key, val, 10, 31)
        elif key == "transpose":
            transpose = _bool(key, val)
        elif key == "pad_to_block_boundary":
            pad = _bool(key, val)
        elif key == "max_parallelism":
            parallelism = None if val == "auto" else _int(key, val, 1, 2**31 - 1)
        elif key in ("transpose_bucket_size", "saturation_delay_ms"):
            continue
        else:
            raise ValueError(f"unknown writer option {key!r} in {text!r}")
    if codec is None:
        codec, level = ZSTD, 3
    if window is not None:
        if codec not in _WINDOWS:
            raise ValueError(f"window_log does not apply to {Compression(codec).name}")
        lo, hi = _WINDOWS[codec]
        if not lo <= window <= hi:
            raise ValueError(f"window_log:{window} is out of range [{lo}, {hi}] for this codec")
    return WriterOptions(
        group_size=group_size,
        compression=Compression(codec, level, window),
        transpose=transpose,
        pad_to_block_boundary=pad,
        max_parallelism=parallelism,
    )
