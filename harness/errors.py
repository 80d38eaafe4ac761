"""The one exception type the command line turns into a one-line message and exit code 2, and
the explainers that turn a framework's error about bad input (a corrupt data file) into one
line: a framework-side module registers one; the neutral core asks without importing it."""


class UsageError(Exception):
  """Bad input from the user: names the bad value and what is allowed."""


EXIT_USAGE = 2

_EXPLAINERS = []


def register_explainer(explain):
  """`explain(error) -> str | None`: one line for an error it knows, else None."""
  _EXPLAINERS.append(explain)
  return explain


def explained(error) -> str | None:
  for explain in _EXPLAINERS:
    line = explain(error)
    if line:
      return line
  return None
