"""Tests of aioloader/describe/."""
