"""The docs are self-contained: nothing points outside the repository.

* No text file names a path outside the checkout (the steering folder beside
  it, its paper copies): papers are cited by key, e.g. ``[Raghavan07] §5.6``,
  and docs/references.md says what each key is.
* Every relative link in the markdown files (inline ``[text](path)`` and
  reference definitions ``[key]: path``) reaches a file of the repository,
  and a ``#anchor`` into a markdown file names one of its headings.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT = (".md", ".py", ".c", ".h", ".proto", ".toml", ".sh", ".rb", ".json", "Vagrantfile")
# Built from pieces so that this file does not match itself.
OUTSIDE = re.compile("|".join([re.escape("../" + "shared"), re.escape("shared" + "/papers"),
                               r"\b[0-9]{3}_[0-9a-f]{16}\.txt\b"]))
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def repo_files() -> list[str]:
    """Tracked files plus new ones not ignored (what the next commit would hold), minus CI's own."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.splitlines() if not f.startswith(".ci/") and (ROOT / f).is_file()]


def markdown() -> list[str]:
    return [f for f in repo_files() if f.endswith(".md")]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\](\([^)]*\))?", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(h) for h in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M)}


def links(text: str) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE.findall(text) + DEFINITION.findall(text)


def test_no_file_points_outside_the_repository():
    hits = []
    for rel in repo_files():
        if not rel.endswith(TEXT):
            continue
        for n, line in enumerate((ROOT / rel).read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, "cite papers by key (docs/references.md), not by a path outside the repository:\n" + \
        "\n".join(hits)


@pytest.mark.parametrize("rel", markdown())
def test_relative_links_reach_files_and_headings_of_the_repository(rel):
    page = ROOT / rel
    broken = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):      # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(ROOT) or not dest.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{rel}: " + "; ".join(broken)


def test_every_cited_paper_key_is_defined_in_references():
    """A citation anywhere (``[Raghavan07] §5.6``, ``[Stanojevic09] eq. 15``) names a heading of
    docs/references.md."""
    defined = anchors(ROOT / "docs" / "references.md")
    assert {"raghavan07", "behl12", "rldesign", "stanojevic09", "ramsden"} <= defined, defined
    cite = re.compile(r"\[([A-Z][A-Za-z]+[0-9]*)\](?:'s)?\s+(?:§|Fig\.|eq\.|Table|end of)")
    unknown = {f"{rel}: [{key}]" for rel in repo_files() if rel.endswith(TEXT)
               for key in cite.findall((ROOT / rel).read_text(errors="replace")) if key.lower() not in defined}
    assert not unknown, sorted(unknown)
