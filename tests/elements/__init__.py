"""Tests of aioloader/elements/."""
