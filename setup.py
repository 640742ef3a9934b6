"""The one thing pyproject.toml cannot say for every setuptools version the build may get:
the per-line kernel's C extension (pipeline/ledger/_ckernel.c, docs/audit.md "The
per-line kernel"). Optional: where it does not build (no compiler, no Python headers),
the install goes on without it and pipeline/ledger/kernel.py uses pysimdjson."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pipeline.ledger._ckernel",
            sources=["pipeline/ledger/_ckernel.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
