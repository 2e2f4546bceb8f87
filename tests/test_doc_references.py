"""Every documentation reference in the repository resolves.

The package, configs, tests, launchers, README.md and docs/ cite the
repository's own documents in these forms:

* `docs/<path>.md`: the file must exist. It may be followed by a section,
  `docs/protocol.md §5.1`, and by more sections of the same file,
  `§5.1, §5.2 and §8` (line breaks and comment markers in between are
  allowed; in markdown the path may be a code span, `docs/protocol.md` §5).
  Each section must be a numbered heading of that file: `## 5. Title` is
  §5, `### 5.1 Title` is §5.1.
* `P<n>`: a pitfall id; it must be a `### P<n>. Title` heading of
  docs/protocol.md, where the ids run from P1 without gaps.
* `paper §N` (or `arXiv:<id>, §N`) is a section of a paper, which we cannot
  check.
* In docs/*.md, any other `§N.M` is a section of the same file; anywhere
  else a `§` must belong to a docs reference or a paper reference.

The reference notes the code used to cite live outside the repository, so
their names in capitals, as the code used to write them, must not occur.
"""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ('lra_msmra', 'lra_msmra_tools', 'configs', 'tests', 'launch',
           'README.md', 'docs')
SUFFIXES = ('.py', '.md', '.sh', '.txt', '.ini', '.cfg', '.toml', '.yaml',
            '.yml')
PITFALL_DOC = 'docs/protocol.md'
# This file spells out the grammar of references, not references.
SELF = 'tests/test_doc_references.py'

SECTION = r'\d+(?:\.\d+)*'
DOC_PATH = re.compile(r'(?<![\w/.-])(docs/[\w./-]+?\.md)(?![\w/-])')
# Between a file and its first section: the end of a code span, spaces, or
# a line break followed by indentation and an optional comment marker.
FIRST = re.compile(r'`?[ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?§(' + SECTION + ')')
MORE = re.compile(r'[ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?(?:,|and|or)[ \t]*'
                  r'(?:\n[ \t]*(?:#[ \t]*)?)?§(' + SECTION + ')')
PITFALL = re.compile(r'(?<![\w/.-])P(\d{1,2})(?![\w])')
# A paper's own section: `paper §4.1`, or after its arXiv id,
# `arXiv:1904.10509, §4.3`.
PAPER = re.compile(r'(?:\bpaper|\barXiv:\d{4}\.\d{4,5}(?:v\d+)?,?)\s*$',
                   re.IGNORECASE)
# Built from parts so that this file does not contain them itself.
NOTES = re.compile(r'\b(?:' + 'PROTO' + 'COL' + '|' + 'ATTEN' + 'TIONS'
                   + r')\b')
HEADING = re.compile(r'^#{2,6}[ \t]+(' + SECTION + r')\.?[ \t]', re.M)
PITFALL_HEADING = re.compile(r'^#{2,6}[ \t]+P(\d+)\.[ \t]', re.M)
FENCE = re.compile(r'^(```|~~~).*?^\1[ \t]*$', re.M | re.S)


def _text(path: str) -> str:
  with open(path, encoding='utf-8') as f:
    return f.read()


def _without_code_blocks(markdown: str) -> str:
  """Blanks fenced code blocks, keeping line numbers."""
  return FENCE.sub(lambda m: '\n' * m.group(0).count('\n'), markdown)


def headings(path: str) -> tuple[set[str], set[int], list[str]]:
  """(section ids, pitfall numbers, structural problems) of a markdown file.

  A problem is a duplicate id, or a subsection whose parent section (its id
  without the last component) is not a heading of the file.
  """
  text = _without_code_blocks(_text(path))
  problems = []
  sections: set[str] = set()
  for m in HEADING.finditer(text):
    sid = m.group(1)
    line = text.count('\n', 0, m.start()) + 1
    if sid in sections:
      problems.append(f'{path}:{line}: duplicate section {sid}')
    parent = sid.rsplit('.', 1)[0] if '.' in sid else None
    if parent is not None and parent not in sections:
      problems.append(f'{path}:{line}: section {sid} is not under a '
                      f'heading {parent}')
    sections.add(sid)
  pitfalls: set[int] = set()
  for m in PITFALL_HEADING.finditer(text):
    n = int(m.group(1))
    if n in pitfalls:
      line = text.count('\n', 0, m.start()) + 1
      problems.append(f'{path}:{line}: duplicate pitfall P{n}')
    pitfalls.add(n)
  return sections, pitfalls, problems


def scanned_files(root: str) -> list[str]:
  """Repository-relative paths of the text files the references live in."""
  found = []
  for top in SCANNED:
    path = os.path.join(root, top)
    if os.path.isfile(path):
      found.append(top)
      continue
    for folder, dirs, files in os.walk(path):
      dirs[:] = sorted(d for d in dirs
                       if not d.startswith('.') and d != '__pycache__')
      for name in sorted(files):
        rel = os.path.relpath(os.path.join(folder, name), root)
        if name.endswith(SUFFIXES) and rel != SELF:
          found.append(rel)
  return found


def check_tree(root: str) -> list[str]:
  """Every broken reference under `root`, as 'file:line: problem'."""
  errors: list[str] = []
  cache: dict[str, tuple[set[str], set[int]] | None] = {}

  def doc(rel: str):
    if rel not in cache:
      path = os.path.join(root, rel)
      if os.path.isfile(path):
        sections, pitfalls, problems = headings(path)
        errors.extend(p.replace(path, rel) for p in problems)
        cache[rel] = (sections, pitfalls)
      else:
        cache[rel] = None
    return cache[rel]

  pitfall_doc = doc(PITFALL_DOC)
  pitfalls = pitfall_doc[1] if pitfall_doc else set()
  if pitfalls and pitfalls != set(range(1, max(pitfalls) + 1)):
    missing = sorted(set(range(1, max(pitfalls) + 1)) - pitfalls)
    errors.append(f'{PITFALL_DOC}: pitfall ids have gaps: '
                  f'{", ".join(f"P{n}" for n in missing)}')

  for rel in scanned_files(root):
    text = _text(os.path.join(root, rel))
    is_doc = rel.startswith('docs/') and rel.endswith('.md')
    if rel.endswith('.md'):
      text = _without_code_blocks(text)

    def where(pos: int) -> str:
      return f'{rel}:{text.count(chr(10), 0, pos) + 1}'

    consumed: set[int] = set()
    for m in NOTES.finditer(text):
      errors.append(f'{where(m.start())}: cites {m.group(0)}, a document '
                    'outside the repository; cite docs/ instead')
      step = FIRST.match(text, m.end())
      while step:  # Its sections are part of the same error.
        consumed.add(step.start(1) - 1)
        step = MORE.match(text, step.end())

    for m in DOC_PATH.finditer(text):
      target = m.group(1)
      info = doc(target)
      if info is None:
        errors.append(f'{where(m.start())}: {target} does not exist')
      pos = m.end()
      step = FIRST.match(text, pos)
      while step:
        sid = step.group(1)
        section_pos = step.start(1) - 1
        consumed.add(section_pos)
        if info is not None and sid not in info[0]:
          errors.append(f'{where(section_pos)}: {target} has no section '
                        f'§{sid}')
        pos = step.end()
        step = MORE.match(text, pos)

    own = doc(rel) if is_doc else None
    for m in re.finditer('§', text):
      if m.start() in consumed:
        continue
      sid = re.match(SECTION, text[m.end():])
      if PAPER.search(text[max(0, m.start() - 40):m.start()]):
        continue  # A section of a paper.
      if own is not None:
        if sid is None or sid.group(0) not in own[0]:
          label = sid.group(0) if sid else '(no number)'
          errors.append(f'{where(m.start())}: {rel} has no section '
                        f'§{label}')
      else:
        errors.append(f'{where(m.start())}: § without a document: write '
                      '`docs/<file>.md §N` or `paper §N`')

    for m in PITFALL.finditer(text):
      if int(m.group(1)) not in pitfalls:
        errors.append(f'{where(m.start())}: P{m.group(1)} is not a pitfall '
                      f'of {PITFALL_DOC} §12')
  return errors


def test_every_reference_resolves():
  errors = check_tree(ROOT)
  assert not errors, 'Broken documentation references:\n' + '\n'.join(errors)


def test_the_mechanism_and_protocol_docs_exist():
  for name in ('protocol', 'mechanisms/softmax', 'mechanisms/cst',
               'mechanisms/long_short', 'mechanisms/adamra',
               'mechanisms/combiner'):
    assert os.path.isfile(os.path.join(ROOT, 'docs', name + '.md')), name
  _, pitfalls, _ = headings(os.path.join(ROOT, PITFALL_DOC))
  # The code cites P1 .. P27 with fixed meanings.
  assert set(range(1, 28)) <= pitfalls


def _write(root, rel, text):
  path = os.path.join(root, rel)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)


@pytest.fixture
def tree(tmp_path):
  root = str(tmp_path)
  _write(root, 'docs/protocol.md',
         '# T\n\n## 1. One\n\n### 1.1 Sub\n\n```\n## 9. In a code block\n```'
         '\n\n## 12. Pitfalls\n\n### P1. First\n\n### P2. Second\n\n'
         'See §1.1 and §12.\n')
  _write(root, 'docs/mechanisms/m.md', '# M\n\n## 3. Choices\n')
  return root


def test_valid_references_pass(tree):
  _write(tree, 'lra_msmra/a.py', '\n'.join([
      '"""Uses docs/protocol.md §1.1, §12 and §1 (P2), paper §4.1,',
      'arXiv:1904.10509, §4.3.',
      '',
      'Also (docs/protocol.md',
      '§1) and docs/mechanisms/m.md §3; docs/protocol.md alone.',
      '"""',
      '# A comment citing docs/protocol.md',
      '# §1.1 across a line break, and PROTOCOLS, P100 or P_1.',
  ]))
  assert check_tree(tree) == []


@pytest.mark.parametrize('line,problem', [
    ('see docs/protocol.md §9', 'has no section §9'),  # only in a code block
    ('see docs/protocol.md §1.1, §1.2', 'has no section §1.2'),
    ('see docs/nothing.md', 'does not exist'),
    ('see docs/mechanisms/m.md §1', 'has no section §1'),
    ('pitfall P3', 'P3 is not a pitfall'),
    ('a bare §1.1', '§ without a document'),
    ('the notes ' + 'PROTO' + 'COL §1', 'outside the repository'),
    ('the notes ' + 'ATTEN' + 'TIONS §1', 'outside the repository'),
])
def test_broken_references_fail_with_file_and_line(tree, line, problem):
  _write(tree, 'configs/x.py', f'"""Fine.\n\n{line}.\n"""\n')
  errors = check_tree(tree)
  assert len(errors) == 1, errors
  assert errors[0].startswith('configs/x.py:3: '), errors
  assert problem in errors[0], errors


def test_broken_markdown_structure_fails(tree):
  _write(tree, 'docs/extra.md',
         '# E\n\n## 2. Two\n\n### 3.1 Orphan\n\n## 2. Again\n\nSee §4.\n')
  errors = sorted(check_tree(tree))
  assert errors == sorted([
      'docs/extra.md:5: section 3.1 is not under a heading 3',
      'docs/extra.md:7: duplicate section 2',
      'docs/extra.md:9: docs/extra.md has no section §4',
  ]), errors


def test_pitfall_gaps_fail(tree):
  _write(tree, 'docs/protocol.md', '# T\n\n## 12. P\n\n### P1. A\n\n'
         '### P3. C\n')
  assert check_tree(tree) == ['docs/protocol.md: pitfall ids have gaps: P2']
