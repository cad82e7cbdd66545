"""Build the one native part: HighwayHash-64 for Riegeli's header and data hashes."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "aioloader.arrayrecord._highwayhash",
            sources=["aioloader/arrayrecord/_highwayhash.c"],
            extra_compile_args=["-O3", "-std=c99"],
        )
    ]
)
