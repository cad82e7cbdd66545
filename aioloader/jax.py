"""JAX integration: process sharding now; device placement and Orbax come with issue 5.

This is the only module that imports jax, and only when it is used.
"""

from __future__ import annotations


def process_index_and_count() -> tuple[int, int]:
    """This process's index and the process count of the JAX runtime."""
    import jax

    return jax.process_index(), jax.process_count()
