"""README.md and docs/**/*.md stay a true map: every relative link exists, every concrete
`python run_benchmark.py ...` command they quote parses with the CLI's own argparse (parsed only,
never run), no line is over 120 characters, and the README stays short, with its reading path
and the two first-screen commands that .ci/run runs."""
import glob
import os
import re
import shlex

import pytest

from harness import cli
from harness.errors import UsageError
from tests.conftest import ROOT

MAX_LINE = 120
README_MAX_LINES = 150       # the README must stay under this
FIRST_SCREEN = 25            # lines
FIRST_SCREEN_PREFIX = "python3 -m venv .venv && "
READING_PATH = ("a run goes run_benchmark.py -> harness/cli.py -> harness/driver.py -> "
                "workloads/parallel/<fw>_trainer_base.py -> workloads/<w>/<fw>_trainer.py; "
                "a workload is declared in workloads/<w>/spec.py")
# A usage synopsis, not a command: an ellipsis, <placeholders> or [optional] brackets.
PLACEHOLDER = re.compile(r"\.\.\.|[<>\[\]]")


def _doc_files():
  files = [os.path.join(ROOT, "README.md")]
  files += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
  return files


def _rel(path):
  return os.path.relpath(path, ROOT)


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read().splitlines()


def _code_lines(lines):
  """The line numbers (0-based) inside fenced (```) or indented (4 spaces) code blocks."""
  code, fenced, prev_blank = set(), False, True
  for i, line in enumerate(lines):
    if line.lstrip().startswith("```"):
      code.add(i)
      fenced = not fenced
    elif fenced:
      code.add(i)
    elif line.startswith("    ") and line.strip() and (prev_blank or i - 1 in code):
      code.add(i)
    prev_blank = not line.strip()
  return code


def _commands_in_code(lines, code):
  """(line number, command text) for each code line, backslash continuations joined."""
  out, i = [], 0
  while i < len(lines):
    if i not in code:
      i += 1
      continue
    start, text = i, lines[i]
    while text.rstrip().endswith("\\") and i + 1 < len(lines) and i + 1 in code:
      i += 1
      text = text.rstrip()[:-1] + " " + lines[i].strip()
    out.append((start + 1, text.strip()))
    i += 1
  return out


def _commands_inline(lines, code):
  """(line number, text) of each `inline code span` outside code blocks."""
  text = "\n".join("" if i in code else line for i, line in enumerate(lines))
  return [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split()))
          for m in re.finditer(r"`([^`]+)`", text)]


def _run_benchmark_commands(text):
  """The `python run_benchmark.py ...` commands in one shell line (after && ; & |), as argv
  lists for the parser; [] when the line quotes none or is a usage synopsis."""
  lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  tokens = list(lexer)
  commands, current = [], []
  for token in tokens + [";"]:
    if token and set(token) <= set(";&|"):
      if current[:2] == ["python", "run_benchmark.py"]:
        commands.append(current[2:])
      current = []
    else:
      current.append(token)
  return commands


def _quoted_commands():
  """(file:line, raw text, argv) of every concrete run_benchmark.py command the docs quote."""
  found = []
  for path in _doc_files():
    lines = _read(path)
    code = _code_lines(lines)
    for lineno, text in _commands_in_code(lines, code) + _commands_inline(lines, code):
      if "python run_benchmark.py" not in text or PLACEHOLDER.search(text):
        continue
      for argv in _run_benchmark_commands(text):
        found.append((f"{_rel(path)}:{lineno}", text, argv))
  return found


def test_the_docs_quote_commands():
  """The extraction itself finds the commands it should (so the parse test cannot pass empty)."""
  where = {w.split(":")[0] for w, _, _ in _quoted_commands()}
  assert {"README.md", "docs/distribution.md", "docs/results-and-checks.md",
          "docs/simulator.md"} <= where, where
  assert _run_benchmark_commands("python run_benchmark.py run resnet50 --seed 1 & "
                                 "python run_benchmark.py list  # all") == [
      ["run", "resnet50", "--seed", "1"], ["list"]]


def test_every_quoted_command_parses_with_the_cli():
  parser = cli.build_parser()
  bad = []
  for where, text, argv in _quoted_commands():
    try:
      parser.parse_args(argv)
    except (UsageError, SystemExit) as e:
      bad.append(f"{where}: {text}\n    -> {e}")
  assert not bad, "commands in the docs that run_benchmark.py's parser refuses:\n" + "\n".join(bad)


def _link_targets(lines, code):
  """(line number, target) of inline links/images and reference definitions outside code."""
  out = []
  for i, line in enumerate(lines):
    if i in code:
      continue
    prose = re.sub(r"`[^`]*`", "", line)
    for m in re.finditer(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", prose):
      out.append((i + 1, m.group(1)))
    m = re.match(r"\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", line)
    if m:
      out.append((i + 1, m.group(1)))
  return out


def test_every_relative_link_exists():
  broken, checked = [], 0
  for path in _doc_files():
    lines = _read(path)
    for lineno, target in _link_targets(lines, _code_lines(lines)):
      if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
        continue                      # http(s), mailto, ...; an anchor in the same file
      checked += 1
      file_part = target.split("#", 1)[0]
      if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), file_part))):
        broken.append(f"{_rel(path)}:{lineno}: {target}")
  assert checked > 10
  assert not broken, "links to paths that do not exist:\n" + "\n".join(broken)


def _first_screen_commands():
  lines = _read(os.path.join(ROOT, "README.md"))
  return [(i + 1, line.strip()) for i, line in enumerate(lines)
          if line.strip().startswith(FIRST_SCREEN_PREFIX)]


def test_no_line_over_120_characters():
  exempt = {("README.md", n) for n, _ in _first_screen_commands()}
  long = []
  for path in _doc_files():
    for i, line in enumerate(_read(path)):
      where = (_rel(path), i + 1)
      if len(line) <= MAX_LINE or where in exempt:
        continue
      long.append(f"{where[0]}:{where[1]}: {len(line)} characters: {line[:60]}...")
  assert not long, f"lines over {MAX_LINE} characters:\n" + "\n".join(long)


def test_readme_first_screen_commands_are_what_ci_runs():
  """The two install-and-go commands, on the first screen; .ci/run runs the test one verbatim."""
  commands = _first_screen_commands()
  assert [n <= FIRST_SCREEN for n, _ in commands] == [True, True], commands
  bench, tests = (c for _, c in commands)
  assert bench.endswith("&& python run_benchmark.py run resnet50"), bench
  assert tests.endswith("&& python -m pytest"), tests
  with open(os.path.join(ROOT, ".ci", "run")) as f:
    ci_lines = [line.strip() for line in f if line.strip().startswith(FIRST_SCREEN_PREFIX)]
  assert ci_lines == [tests], (ci_lines, tests)


def test_readme_is_a_short_map_with_the_reading_path():
  lines = _read(os.path.join(ROOT, "README.md"))
  assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"
  assert " ".join(READING_PATH.split()) in " ".join(" ".join(lines).split()), (
      "README.md lacks the reading path: " + READING_PATH)
  from harness import registry  # pylint: disable=import-outside-toplevel
  # every registered workload's folder (the registry, not a count kept by hand)
  workloads = sorted({registry.get(n).input_pipeline_module.split(".")[1]
                      for n in registry.names()})
  folders = sorted(d for d in os.listdir(os.path.join(ROOT, "workloads"))
                   if os.path.exists(os.path.join(ROOT, "workloads", d, "spec.py")))
  assert workloads == folders, (workloads, folders)
  for fw in ("jax", "tf"):
    for w in workloads:
      for path in ("run_benchmark.py", "harness/cli.py", "harness/driver.py",
                   f"workloads/parallel/{fw}_trainer_base.py", f"workloads/{w}/{fw}_trainer.py",
                   f"workloads/{w}/spec.py"):
        assert os.path.exists(os.path.join(ROOT, path)), path


def test_code_fences_are_closed():
  """An unclosed ``` would hide the rest of a file from the link and command checks."""
  unclosed = [_rel(p) for p in _doc_files()
              if sum(line.lstrip().startswith("```") for line in _read(p)) % 2]
  assert not unclosed, "files with an unclosed ``` fence: " + ", ".join(unclosed)


def test_readme_links_every_doc():
  text = "\n".join(_read(os.path.join(ROOT, "README.md")))
  missing = [_rel(p) for p in _doc_files()[1:] if f"]({_rel(p)})" not in text
             and f"]: {_rel(p)}" not in text]
  assert not missing, "docs the README does not link: " + ", ".join(missing)


def test_every_registered_workload_has_its_doc_linked_from_the_readme():
  """A workload the registry lists has docs/workloads/<name>.md, and the README's workload
  table links it (adding a workload: docs/adding-a-workload.md)."""
  from harness import registry  # pylint: disable=import-outside-toplevel
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  for name in registry.names():
    doc = f"docs/workloads/{name}.md"
    assert os.path.exists(os.path.join(ROOT, doc)), doc
    assert f"[{name}]: {doc}" in readme, f"the README's workload table lacks {name}"
