"""Every pointer to a section of the docs names a section that exists.

Code and docs point readers to a section as ``docs/tce.md, "Speed"`` (in comments, docstrings, messages, scripts, the
Makefile; the quotes double, single or escaped in a string) or, in markdown, as ``[tce.md](tce.md), "Limitations"``. A
section is a heading or a bold lead-in (``**Study**``) of that file; a pointer may give its start only (``"Hopper
jump"`` for "Hopper jump (`fancy/hopper-jump`)"). Renaming a section without its pointers fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# docs/x.md, "Section" (a pointer may wrap onto a comment's next line; the comma and brackets are optional); not the
# target of a markdown link, which LINK reads
POINTER = re.compile(r"""(?<!\]\()(?<![\w/.])(docs/[\w\-/]+\.md)\)?,? \(?\\?(["'])([^\\\n]{2,100}?)\\?\2""")
# in markdown: [x.md](x.md), "Section"
LINK = re.compile(r"""\]\(([\w\-/.]+\.md)\)\)?,? \(?(["'])([^\n]{2,100}?)\2""")


def sections(doc: Path) -> set[str]:
    """The headings and bold lead-ins of a markdown file, without trailing punctuation."""
    text = doc.read_text()
    found = {m.group(1).strip() for m in re.finditer(r"^#+\s+(.+)$", text, re.MULTILINE)}
    return found | {b.strip().rstrip(".:") for b in re.findall(r"\*\*([^*]+?)\*\*", text)}


def pointers(path: Path, root: Path) -> list[tuple[str, str]]:
    """(doc relative to root, section) of every pointer in ``path``; a comment's line breaks (and ``#``) are joined."""
    text = re.sub(r"\s*\n\s*(?:#+\s*)?", " ", path.read_text())
    found = [(m.group(1), m.group(3)) for m in POINTER.finditer(text)]
    if path.suffix == ".md":
        for m in LINK.finditer(text):
            target = (path.parent / m.group(1)).resolve()
            if target.is_relative_to(root.resolve()):
                found.append((target.relative_to(root.resolve()).as_posix(), m.group(3)))
    return list(dict.fromkeys(found))


def dangling(root: Path) -> list[str]:
    files = [root / "Makefile", root / "README.md"]
    for folder in ("src", "tests", "benchmarks", "experiments", "examples", "docs"):
        files += sorted(p for p in (root / folder).rglob("*") if p.suffix in (".py", ".md", ".sh"))
    bad, known = [], {}
    for path in files:
        if not path.is_file() or path.resolve() == Path(__file__).resolve():  # its own examples point nowhere
            continue
        for doc, section in pointers(path, root):
            target = root / doc
            if not target.is_file():
                bad.append(f"{path.relative_to(root)}: {doc} does not exist")
                continue
            heads = known.setdefault(doc, sections(target))
            if not any(head.startswith(section) for head in heads):
                bad.append(f'{path.relative_to(root)}: {doc} has no section "{section}"')
    return bad


def test_every_pointer_to_a_docs_section_names_one_that_exists():
    assert dangling(ROOT) == []


def test_the_check_finds_a_renamed_section_and_a_missing_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Speed (one core)\n\n**Study** (`make x`): ...\n")
    (tmp_path / "docs" / "b.md").write_text('See [a.md](a.md), "Study", and [a.md](a.md), "Results".\n')
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text('# the rate (docs/a.md, "Speed"); the\n# bound (docs/c.md, "Bound")\n'
                                            '# wrapped (docs/a.md, "Speed\n# (one core)")\n'
                                            'ERR = "docs/a.md, \\"Study\\"; docs/a.md, \'Studies\'"\n')  # fmt: skip
    (tmp_path / "Makefile").write_text('# docs/a.md, "Spead"\n')
    assert dangling(tmp_path) == [
        'Makefile: docs/a.md has no section "Spead"',
        "src/m.py: docs/c.md does not exist",
        'src/m.py: docs/a.md has no section "Studies"',
        'docs/b.md: docs/a.md has no section "Results"',
    ]
