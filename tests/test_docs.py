"""The documentation cannot drift from the code.

* ``mkdocs build --strict`` of the site (mkdocs.yml, docs/): a broken link, a missing page, a
  page left out of the navigation or an API reference entry that does not resolve fails.
* Every Python code block of README.md and of the guide (docs/, except the benchmark outputs
  in docs/results/) is executed: in one process, or under mpirun / torchrun as the HTML
  comment before the block says (tests/docs_blocks.py). A block fails on a non-zero exit
  status or a timeout; blocks marked ``skip`` are reported as skipped with their reason.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from docs_blocks import ROOT, Block, MarkerError, all_blocks, blocks_of, parse_marker
from launchers import env, mpirun, torchrun

TIMEOUT_S = {"single": 120, "mpirun": 240, "torchrun": 240}
#: Illustrative fragments that are not run: keep them few (each needs a reason).
MAX_SKIPPED = 3
README_MAX_LINES = 160

BLOCKS = all_blocks()


def run_block(block: Block, workdir: Path) -> subprocess.CompletedProcess:
    """Run one block from ``workdir`` with its launcher; fail the test (with the block's
    output) on a non-zero exit status or a timeout. The whole process group is killed on a
    timeout, so no rank outlives it."""
    script = workdir / "block.py"
    script.write_text(f"# {block.id}\n{block.code}", encoding="utf-8")
    if block.launcher == "single":
        cmd = [sys.executable, str(script)]
    elif block.launcher == "mpirun":
        cmd = mpirun(block.np, str(script))
    elif block.launcher == "torchrun":
        cmd = torchrun(block.np, str(script))
    else:
        raise AssertionError(f"{block.id}: launcher {block.launcher!r} does not run")
    timeout = TIMEOUT_S[block.launcher]
    e = dict(env(), NO_MKDOCS_2_WARNING="1")
    proc = subprocess.Popen(cmd, cwd=workdir, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{block.id} ({' '.join(cmd[:6])} ...) timed out after {timeout}s\n"
                    f"stdout:\n{out[-4000:]}\nstderr:\n{err[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"{block.id} failed ({block.launcher}, rc={proc.returncode})\n--- block\n{block.code}"
                    f"--- stdout\n{out[-4000:]}\n--- stderr\n{err[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_code_block(block: Block, tmp_path):
    if block.launcher == "skip":
        pytest.skip(f"illustrative fragment: {block.reason}")
    run_block(block, tmp_path)


def test_block_inventory():
    """What the parametrized test covers: the README and most guide pages have blocks, and the
    fragments that are not run stay few."""
    by_page = {}
    for b in BLOCKS:
        by_page.setdefault(b.path, []).append(b)
    assert "README.md" in by_page, "the README's usage example is not a Python block"
    assert all(b.launcher != "skip" for b in by_page["README.md"]), "the README's blocks must all run"
    skipped = [b.id for b in BLOCKS if b.launcher == "skip"]
    assert len(skipped) <= MAX_SKIPPED, f"too many blocks marked skip (at most {MAX_SKIPPED}): {skipped}"
    assert len(BLOCKS) - len(skipped) >= 15, f"only {len(BLOCKS) - len(skipped)} blocks run"
    assert {"single", "mpirun"} <= {b.launcher for b in BLOCKS}
    for page in ("docs/guide/getting_started.md", "docs/guide/codecs/onebit.md", "docs/guide/exchange.md",
                 "docs/guide/checkpoints_failures.md"):
        assert page in by_page, f"{page} has no Python block"


def test_markers_parse():
    assert parse_marker("single process") == ("single", 1, "")
    assert parse_marker("mpirun -np 3") == ("mpirun", 3, "")
    assert parse_marker("torchrun -np 2") == ("torchrun", 2, "")
    assert parse_marker("skip: needs a GPU") == ("skip", 1, "needs a GPU")
    for bad in ("mpirun -np 0", "mpi -np 2", "skip", "skip:", "single"):
        with pytest.raises(MarkerError):
            parse_marker(bad)
    page = ("text\n\n<!-- docs-test: mpirun -np 2 -->\n```python\nimport os\n```\n\n"
            "```python\nx = 1\n```\n\n- a list item:\n\n    ```py\n    y = 2\n    ```\n")
    got = blocks_of(page, "p.md")
    assert [(b.line, b.launcher, b.np, b.code) for b in got] == [
        (4, "mpirun", 2, "import os\n"), (8, "single", 1, "x = 1\n"), (14, "single", 1, "y = 2\n")]
    for stray in ("<!-- docs-test: mpirun -np 2 -->\n\n```bash\nls\n```\n",     # marker on a shell block
                  "<!-- docs-test: mpirun -np 2 -->\ntext\n```python\nx\n```\n",  # prose in between
                  "<!-- docs-test: skip: x -->\n"):                              # nothing after it
        with pytest.raises(MarkerError):
            blocks_of(stray, "p.md")


def test_failing_block_fails(tmp_path):
    """The runner reports a block that raises, and one that exits non-zero under mpirun."""
    with pytest.raises(pytest.fail.Exception, match="rc=1"):
        run_block(Block("x.md", 1, "raise RuntimeError('documented behaviour changed')\n", "single"), tmp_path)
    with pytest.raises(pytest.fail.Exception, match="rc="):
        run_block(Block("x.md", 2, "from mpi4py import MPI\nassert MPI.COMM_WORLD.size == 3, MPI.COMM_WORLD.size\n",
                        "mpirun", 2), tmp_path)


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_mkdocs_build_strict(tmp_path):
    try:
        import mkdocs  # noqa: F401
        import material  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as e:
        pytest.fail(f"{e}: install the docs tools with `.venv/bin/python -m pip install mkdocs mkdocs-material "
                    f"'mkdocstrings[python]'` (ci/install_python.sh does)")
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"), capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    # the API reference was generated from the docstrings, not left as ::: lines
    pages_ = sorted((site / "reference").rglob("index.html"))
    assert len(pages_) >= 5, pages_
    for page in pages_:
        html = page.read_text(encoding="utf-8")
        assert ":::" not in html, f"{page}: an API entry was not rendered"
        assert ":func:" not in html and ":class:" not in html, f"{page}: mkdocs_hooks.py left a Sphinx role"
    api = (site / "reference" / "compression" / "index.html").read_text(encoding="utf-8")
    assert "CodecCompression" in api
    assert "error_feedback" in api, "the factories' docstrings are missing from the API reference"
    for png in ("results/exchange_k4.png", "results/breakdown_k4.png"):
        assert (site / png).is_file(), f"{png} is not in the site"


def test_readme_links_resolve():
    """The README's relative links point at files that exist (GitHub renders it outside the site)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]
    assert targets, "no relative links found in README.md"
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
