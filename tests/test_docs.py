"""The documentation: the site builds strictly, the README's links resolve, and user docs carry no issue numbers."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_docs_site_builds_strictly(tmp_path):
    """mkdocs --strict: a broken link or anchor, or a page left out of the navigation, fails."""
    pytest.importorskip("mkdocs")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "security" / "index.html").exists()


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not t.startswith(("http://", "https://", "mailto:"))]
    assert local, "the README links to its docs"
    for t in local:
        assert (ROOT / t).exists(), f"README links to {t}, which does not exist"


def test_readme_fits_on_a_few_screens():
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


def test_user_docs_carry_no_issue_numbers():
    pattern = re.compile(r"\bissues?\s*#?\d+|(?<![\w/&])#\d{1,4}\b", re.IGNORECASE)
    for path in [ROOT / "README.md", ROOT / "helm" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not pattern.search(line), f"{path.relative_to(ROOT)}:{n}: {line.strip()}"


def test_readme_demo_sample_numbers_the_slow_group_by_the_jobs_steps():
    """The live demo's slow_group once named window-relative steps (16-19) beside the regime change at step 30;
    the daemon now numbers them as the job's, and the README's sample must show what it prints."""
    text = (ROOT / "README.md").read_text()
    regime = re.search(r"regime_change (job-\w+) .* at step (\d+) and stayed slow", text)
    group = re.search(r"slow_group +(job-\w+) .* steps (\d+)-\d+ \(\d+ steps\)", text)
    assert regime and group, "the README shows the live demo's regime_change and slow_group lines"
    assert group.group(1) == regime.group(1) and group.group(2) == regime.group(2)
