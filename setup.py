# SPDX-License-Identifier: Apache-2.0
"""Build of lmcache-adp: the Python package plus the pybind11 core in src_cpp/."""

import os
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

ROOT = Path(__file__).parent
SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src_cpp").rglob("*.cc"))

ParallelCompile("ADP_BUILD_JOBS", default=0).install()

# The C++ sources' digest goes into the module (_native.SOURCE_DIGEST): benchmarks/tools.native_build()
# compares it with the tree's sources to tell a stale build by content.
digest_ns = {}
exec((ROOT / "lmcache_adp" / "source_digest.py").read_text(), digest_ns)
SOURCE_DIGEST = digest_ns["source_digest"](ROOT)

# Warnings are always on; ADP_WERROR=1 (set by the test script and CI) makes
# them errors, so none lands, without breaking a user's build on a newer compiler.
WARNINGS = ["-Wall", "-Wextra", "-Wno-missing-field-initializers"]
if os.environ.get("ADP_WERROR") == "1":
    WARNINGS.append("-Werror")


class BuildExt(build_ext):
    """build_ext that also rebuilds when the module it would skip (up to date by file times) records other
    sources than the tree's: an edit saved while a build compiled is older than that build's module, and
    times alone would keep the old code until the file is touched again."""

    def build_extension(self, ext):
        built = Path(self.get_ext_fullpath(ext.name))
        if built.exists() and digest_ns["recorded_digest"](built) != SOURCE_DIGEST:
            self.force = True
        super().build_extension(ext)


ext = Pybind11Extension(
    "lmcache_adp._native",
    SOURCES,
    include_dirs=["src_cpp"],
    define_macros=[("ADP_SOURCE_DIGEST", f'"{SOURCE_DIGEST}"')],
    cxx_std=20,
    extra_compile_args=["-O2", *WARNINGS],
    extra_link_args=["-pthread"],
)

version = {}
exec((ROOT / "lmcache_adp" / "_version.py").read_text(), version)

setup(
    name="lmcache-adp",
    version=version["__version__"],
    description="ADP storage card as the L2 tier of the LMCache multiprocess server",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["lmcache_adp", "lmcache_adp.*"]),
    package_data={"lmcache_adp": ["_native.pyi"]},  # the binding's type stubs
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    install_requires=["numpy", "prometheus_client", "tqdm"],
    extras_require={
        "lmcache": ["lmcache>=0.5.4,<0.6"],
        "test": [
            "pytest>=8",
            "pytest-benchmark",
            "numpy",
            "google-crc32c",
            # the style gate (scripts/check_style.sh), pinned so every machine formats alike
            "ruff==0.17.6",
            "clang-format==23.1.5",
            # scripts/sanitize.sh asan-python compiles bindings.cc outside setup.py's build env
            "pybind11>=2.12",
        ],
    },
    entry_points={"console_scripts": ["lmcache-adp=lmcache_adp.cli:main"]},
    zip_safe=False,
)
