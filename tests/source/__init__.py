"""Tests of aioloader/source/."""
