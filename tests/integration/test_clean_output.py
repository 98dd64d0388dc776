"""What a user sees: no third-party warnings between SpecSweep's own lines.

The zoo build trains, distils, measures and saves models through transformers, accelerate and
(on saving) DeepSpeed, whose deprecation warnings and CPU accelerator probe used to print
between the progress bars. Run as a user runs it, in a fresh process with Python's default
warning filters shown (``-W default``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = pytest.mark.zoo

#: Lines a third-party library prints that the user should not see.
#: Python as a user runs it, with the default warning filters shown.
PYTHON_DEFAULT_WARNINGS = (sys.executable, "-W", "default")
#: The micro zoo build, without progress bars: from the command line and from Python.
ZOO_BUILDS_MICRO = {
    "cli": ("-m", "orchestrator", "zoo", "build", "--profile", "micro", "--no-progress"),
    "python-api": (
        "-c",
        "from training.zoo.build import build_zoo;"
        " print(build_zoo('micro', progress=False).profile)",
    ),
}
NOISE = ("Warning", "deprecated", "Setting accelerator")


@pytest.mark.slow
@pytest.mark.parametrize("entry", sorted(ZOO_BUILDS_MICRO))
def test_zoo_build_prints_no_third_party_warning(tmp_path: Path, entry: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    env["SPECSWEEP_CACHE"] = str(tmp_path / "cache")
    run = subprocess.run(
        [*PYTHON_DEFAULT_WARNINGS, *ZOO_BUILDS_MICRO[entry]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    output = run.stdout + run.stderr
    noisy = [line for line in output.splitlines() if any(word in line for word in NOISE)]
    assert noisy == [], "\n".join(noisy)
    assert "micro" in output
