"""Build the native parts: HighwayHash-64 for Riegeli's header and data hashes, the
footer-entry parser, and the loop over small one-record chunks.

All are optional: without a C compiler (or Python headers) the build goes on without them
and the package uses its pure-Python fallbacks (``aioloader.arrayrecord.hashing`` warns once
that hashing is then slow). On CPython >= 3.11 they use only the limited C API, so the wheel
is ``abi3`` and serves every later CPython; 3.10 lacks the buffer protocol in the limited API
and gets a version-specific build. A wheel in which none compiled holds only Python, and
is tagged so (``py3-none-any``, ``Root-Is-Purelib: true``): a platform tag would promise
native code it does not have. Metadata lives in pyproject.toml.
"""

import os
import sys
import sysconfig
from importlib.machinery import EXTENSION_SUFFIXES

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel

# The buffer protocol joined the limited API in 3.11; free-threaded builds have no stable ABI.
LIMITED = (
    sys.implementation.name == "cpython"
    and sys.version_info >= (3, 11)
    and not sysconfig.get_config_var("Py_GIL_DISABLED")
)
LIMITED_API_HEX = "0x030B0000"  # keep in step with py_limited_api="cp311" below


def native(name: str) -> Extension:
    return Extension(
        f"aioloader.arrayrecord.{name}",
        sources=[f"aioloader/arrayrecord/{name}.c"],
        extra_compile_args=["-O3", "-std=c99"] if sys.platform != "win32" else [],
        define_macros=[("Py_LIMITED_API", LIMITED_API_HEX)] if LIMITED else [],
        py_limited_api=LIMITED,
        optional=True,  # a failed compile leaves the pure-Python fallback in use
    )


class BdistWheel(bdist_wheel):
    """bdist_wheel that tags a wheel by what it holds: pure when no extension compiled."""

    laid_out = False  # run() calls get_tag() once the package is laid out in bdist_dir

    def run(self) -> None:
        self.laid_out = True
        super().run()

    def get_tag(self) -> tuple[str, str, str]:
        # For the file name and WHEEL; editable installs ask before any build: left as is.
        if self.laid_out and not self.root_is_pure and not any(
                name.endswith(tuple(EXTENSION_SUFFIXES))
                for _, _, names in os.walk(self.bdist_dir) for name in names):
            self.root_is_pure = True  # py3-none-any, Root-Is-Purelib: true
            self.py_limited_api = False
        return super().get_tag()


setup(
    ext_modules=[native("_highwayhash"), native("_footer"), native("_onerecords")],
    cmdclass={"bdist_wheel": BdistWheel},
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if LIMITED else {},
)
