"""Tests of aioloader/io/."""
