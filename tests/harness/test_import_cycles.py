"""No import circles among the project's modules, counting the imports inside functions (a
circle closed by a deferred import is still a circle: harness/cli <-> commsim, ssd/spec ->
host_eval -> input_pipeline -> spec and the Transformer's were three until they were cut)."""
import ast
import os

from tests.conftest import ROOT

PACKAGES = ("harness", "workloads", "bench")


def _modules():
  found = {}
  for package in PACKAGES:
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if name.endswith(".py"):
          path = os.path.join(folder, name)
          module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
          found[module.removesuffix(".__init__")] = path
  return found


def _imports(path, modules):
  """The project modules `path` imports anywhere in it (a package's own __init__ left out)."""
  out = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [f"{node.module}.{alias.name}" for alias in node.names]
    else:
      continue
    for name in names:
      while name and name not in modules:
        name = name.rpartition(".")[0]
      if name and not modules[name].endswith("__init__.py"):
        out.add(name)
  return out


def _circles(edges):
  """Tarjan's strongly connected components of more than one module."""
  index, low, stack, on_stack, circles = {}, {}, [], set(), []

  def visit(module):
    index[module] = low[module] = len(index)
    stack.append(module)
    on_stack.add(module)
    for other in edges[module]:
      if other not in index:
        visit(other)
        low[module] = min(low[module], low[other])
      elif other in on_stack:
        low[module] = min(low[module], index[other])
    if low[module] == index[module]:
      component = []
      while not component or component[-1] != module:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      if len(component) > 1:
        circles.append(sorted(component))

  for module in edges:
    if module not in index:
      visit(module)
  return circles


def test_the_circle_finder_finds_a_deferred_circle():
  edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert _circles(edges) == [["a", "b", "c"]]


def test_no_import_circles():
  modules = _modules()
  edges = {m: _imports(path, modules) - {m} for m, path in modules.items()}
  assert len(edges) > 100 and "harness.results" in edges["harness.driver"]   # the graph is read
  assert _circles(edges) == []
