"""Tests of aioloader/formats/."""
