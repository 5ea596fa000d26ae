"""The order of a run's modules, and which are slow.

Under pytest-xdist (``--dist loadfile``) each process takes a whole module at a time, in
the order collected: the slowest go first, so that the run does not end with one process
still on a long module while the other idles. ``durations.json`` holds each module's
seconds in a run of two processes on a 2-core machine (rounded; a module missing from it
counts as quick and goes last). Refresh it after adding a slow module:
``pytest -n 2 --dist loadfile --junitxml=run.xml`` then ``python -m tests.scheduling
run.xml``. Modules of SLOW_MODULE_S or more are marked ``slow`` (``-m "not slow"`` skips
them for a quick check).

Debian packages that some tests install when missing (as root, as CI does) are installed
at the start of the run in the background, while the first modules run, instead of by
the first test that needs each one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
SLOW_MODULE_S = 30
# (program, Debian package) the tests ensure with tests.infra.ensure_program.
PACKAGES = (("chromium", "chromium"), ("pgbouncer", "pgbouncer"))


def module_durations() -> dict[str, float]:
    try:
        found = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(name): float(seconds) for name, seconds in found.items()}


def order_and_mark(items: list[pytest.Item], *, slowest_first: bool) -> None:
    """Mark the slow modules' tests; with ``slowest_first``, put the slowest modules
    first (a stable sort: each module's tests stay together and in their order)."""
    durations = module_durations()

    def seconds(item: pytest.Item) -> float:
        return durations.get(item.nodeid.split("::", 1)[0], 0.0)

    for item in items:
        if seconds(item) >= SLOW_MODULE_S:
            item.add_marker(pytest.mark.slow)
    if slowest_first:
        items.sort(key=lambda item: -seconds(item))


def install_missing_in_background() -> None:
    """Start installing the missing packages (root with apt-get only), holding the lock
    that tests.infra.ensure_program takes: a test that needs one waits for it there."""
    missing = [package for program, package in PACKAGES if not _which(program)]
    if not missing or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    code = "import sys; from tests.infra import install_packages; install_packages(sys.argv[1:])"
    subprocess.Popen(
        [sys.executable, "-c", code, *missing],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C of the run does not cut dpkg short
    )


def _which(program: str) -> str | None:
    return shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin")


def write_durations(junit_xml: Path) -> None:
    """Rewrite durations.json from a run's JUnit XML (``--junitxml``)."""
    totals: Counter[str] = Counter()
    for case in ET.parse(junit_xml).iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        totals[module] += float(case.get("time", 0.0))
    ranked = {name: round(s) for name, s in totals.most_common() if round(s) >= 1}
    DURATIONS.write_text(json.dumps(ranked, indent=1) + "\n")


if __name__ == "__main__":
    write_durations(Path(sys.argv[1]))
