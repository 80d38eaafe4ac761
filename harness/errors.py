"""The one exception type the command line turns into a one-line message and exit code 2."""


class UsageError(Exception):
  """Bad input from the user: names the bad value and what is allowed."""


EXIT_USAGE = 2
