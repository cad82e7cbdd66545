"""Tests of aioloader/runtime/."""
