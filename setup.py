"""Build the native parts: HighwayHash-64 for Riegeli's header and data hashes, and the
footer-entry parser (both optional at run time: pure-Python fallbacks)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "aioloader.arrayrecord._highwayhash",
            sources=["aioloader/arrayrecord/_highwayhash.c"],
            extra_compile_args=["-O3", "-std=c99"],
        ),
        Extension(
            "aioloader.arrayrecord._footer",
            sources=["aioloader/arrayrecord/_footer.c"],
            extra_compile_args=["-O3", "-std=c99"],
        ),
    ]
)
