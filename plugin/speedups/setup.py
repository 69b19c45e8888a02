"""Build hook of the accelerator's distribution (metadata: pyproject.toml).

One extension, `parallelhue_vllm._speedups`, from src/*.c; it is not optional
here: installing this distribution means wanting it, and a build without a
compiler fails loudly (the plugin itself never needs one).
"""

from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent

setup(
    ext_modules=[
        Extension(
            "parallelhue_vllm._speedups",
            sorted(str(path.relative_to(HERE)) for path in (HERE / "src").glob("*.c")),
            depends=sorted(str(path.relative_to(HERE)) for path in (HERE / "src").glob("*.h")),
            extra_compile_args=["-O2", "-fvisibility=hidden"],
        )
    ]
)
