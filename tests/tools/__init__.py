"""Tests of aioloader/tools/."""
