"""Tests of aioloader/index/."""
