"""Build hook for the optional C accelerator (metadata: pyproject.toml).

`parallelhue_vllm._speedups` is built when a C compiler and Python's headers are
there; when they are not, the build goes on without it and the plugin runs its
pure-Python code (optional=True). The server never needs a compiler.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "parallelhue_vllm._speedups",
            ["parallelhue_vllm/_speedups.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
