"""Tests of aioloader/arrayrecord/."""
