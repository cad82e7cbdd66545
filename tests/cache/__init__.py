"""Tests of aioloader/cache/."""
