"""The release under test: what the venv's vLLM offers agrees with releases.FIRST.

The live tier skips a test only through `releases.require`, whose reason names
the missing feature and the release that introduced it; this check makes such a
skip trustworthy (a release that has the feature cannot skip it); the second,
that the plugin installs its hooks on this release in a process of vLLM's own
environment, and that its table of tested releases says this one runs live.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import releases
import server

pytestmark = pytest.mark.vllm


def test_the_release_has_exactly_the_features_of_its_version() -> None:
    release = releases.probe()
    expected = {name: release.number >= first for name, first in releases.FIRST.items()}
    assert release.features == expected, release
    print("\n" + release.summary())


def test_the_plugin_installs_its_hooks_on_this_release() -> None:
    release = releases.probe()
    done = subprocess.run(
        [
            str(server.vllm_python()),
            "-c",
            "import logging, sys; logging.basicConfig(stream=sys.stdout, level=logging.INFO)\n"
            "from parallelhue_vllm import plugin; plugin.register()\n"
            "print('installed' if plugin.installed() else 'not installed')",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PARALLELHUE_VLLM_EXACT": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "installed", done.stdout + done.stderr[-2000:]
    assert f"hooks installed for vLLM {release.version}" in done.stdout, done.stdout
    # The plugin's table of tested releases says this one runs live (this tier is that test).
    assert "never tested" not in done.stdout, done.stdout
    from parallelhue_vllm.adapters import targets

    assert targets.TESTED.get(release.version.split("+", 1)[0], "").startswith("live"), (
        release.version,
        targets.TESTED,
    )
