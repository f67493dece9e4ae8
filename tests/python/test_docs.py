"""The documentation stays true to the tree.

Every relative link in the project's markdown resolves to a file (and, for a link into a markdown
file with an anchor, to one of its headings); every command in a fenced block of the README and
docs/ names a script or binary of the project or a known system tool; the README stays a hub of at
most 200 lines; where cheap, a named script parses its flags (--help).
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The markdown a reader meets: the README, the topic pages, the engine's reference, and every
# README or results page beside the code (build folders and virtual environments excluded).
SKIP_DIRS = {".venv", ".git", ".gpu", "out", "node_modules"}


def markdown_files():
    out = []
    for p in sorted(ROOT.rglob("*.md")):
        rel = p.relative_to(ROOT)
        if rel.parts[0] in SKIP_DIRS or rel.parts[0].startswith("build"):
            continue
        out.append(p)
    return out


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def links(path):
    """(line number, target) of every markdown link outside fenced blocks and code spans."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            out.append((n, m.group(2)))
    return out


def test_the_readme_is_a_hub():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; topic pages go under docs/"
    text = "\n".join(lines)
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in text, f"README's index does not link docs/{page.name}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    bad = []
    for n, target in links(path):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"line {n}: {target} (no {dest.relative_to(ROOT)})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"line {n}: {target} (no heading #{anchor} in {dest.name})")
    assert not bad, f"{path.relative_to(ROOT)}: " + "; ".join(bad)


# Tools a user runs beside kolo's own; anything else must be a path into the project.
KNOWN_TOOLS = {
    "mpirun", "mpiexec", "srun", "sbatch", "tc", "ip", "export", "cmake", "ctest", "ninja",
    "python3", "git", "apt-get", "nvidia-smi", "tcpdump", "sudo", "env", "cd", "ls", "cat",
    "ethtool", "ibv_devinfo", "rdma",
}  # fmt: skip

SHELL_LANGS = {"", "sh", "bash", "shell", "console"}


def fenced_commands(path):
    """(line number, first word) of every command in the fenced shell blocks of `path`."""
    out, lang, cont = [], None, False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = re.match(r"^\s*```(\w*)", line)
        if m:
            lang = m.group(1) if lang is None else None
            cont = False
            continue
        if lang is None or lang not in SHELL_LANGS:
            continue
        text = line.strip()
        if cont:
            cont = text.endswith("\\")
            continue
        cont = text.endswith("\\")
        if not text or text.startswith("#"):
            continue
        words = [w for w in text.split() if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]
        if words:
            out.append((n, words[0]))
    return out


def built_binaries():
    """Names every `build/bin/NAME` may take: the executables the CMake files declare."""
    names = set()
    for cm in ROOT.rglob("CMakeLists.txt"):
        rel = cm.relative_to(ROOT)
        if rel.parts[0].startswith("build") or rel.parts[0] in SKIP_DIRS:
            continue
        names.update(re.findall(r"add_executable\(\s*([\w-]+)", cm.read_text(encoding="utf-8")))
    # Tests are declared per source file: kolo_<file stem> (kolo_mp_ for tests/mpi).
    for src in (ROOT / "tests").rglob("*_test.cc"):
        names.add(("kolo_mp_" if src.parent.name == "mpi" else "kolo_") + src.stem)
    return names


DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_names_something_that_exists(path):
    binaries = built_binaries()
    bad = []
    for n, word in fenced_commands(path):
        if word in KNOWN_TOOLS:
            continue
        m = re.match(r"^build[\w-]*/bin/([\w-]+)$", word)
        if m:
            if m.group(1) not in binaries:
                bad.append(f"line {n}: {word} (no such executable in the CMake files)")
            continue
        target = ROOT / word
        if not (target.is_file() and target.stat().st_mode & 0o111):
            bad.append(f"line {n}: {word} (neither a project script nor a known tool)")
    assert not bad, f"{path.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_commands_are_checked_at_all():
    # The parser must find the commands the README is known to hold, or the test above proves
    # nothing.
    words = [w for _, w in fenced_commands(ROOT / "README.md")]
    assert "scripts/main" in words and "scripts/test" in words, words
    gpus = [w for _, w in fenced_commands(ROOT / "docs" / "gpus.md")]
    assert "scripts/gpu-check" in gpus, gpus


# Scripts whose --help is cheap (no build, no bootstrap) and that the docs show.
HELP_SCRIPTS = ["scripts/gpu-check", "scripts/gpu/pack-deps", "scripts/cluster", "scripts/sweep"]


@pytest.mark.parametrize("script", HELP_SCRIPTS)
def test_documented_scripts_parse_their_flags(script):
    done = subprocess.run(
        [str(ROOT / script), "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() or done.stderr.strip()
