"""Tests of aioloader/jax.py: placement, multi-host."""
