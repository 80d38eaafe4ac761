"""Conv geometry shared by the models of both frameworks (plain Python: the specs use it before
any framework loads)."""


def same_padding(size, kernel, stride):
  """TF's 'SAME' padding of one spatial dimension: (before, after), the odd pixel after."""
  total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2
