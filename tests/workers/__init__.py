"""Tests of aioloader/workers/."""
