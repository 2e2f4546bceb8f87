"""Errors the user can fix, reported by the command line in one line.

A config, data or workdir problem is explained by its message (the key, the
file, the fix); a traceback through the trainer adds nothing. The trainer
marks such exceptions where it knows they come from the user's input (the
config, the data folder, the workdir), without changing their types, which
tests and callers rely on. `python -m lra_msmra.main` prints a marked
exception as `error: <message>` and exits with status 1; every other
exception keeps its traceback.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

_MARK = '_lra_msmra_user_error'

# What config validation and the data modules raise for bad input.
INPUT_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError)


def mark(error: BaseException) -> BaseException:
  """Marks `error` as the user's to fix; returns it."""
  setattr(error, _MARK, True)
  return error


def is_user_error(error: BaseException) -> bool:
  return bool(getattr(error, _MARK, False))


@contextlib.contextmanager
def input_errors() -> Iterator[None]:
  """Marks the INPUT_ERRORS raised inside the block (and re-raises them)."""
  try:
    yield
  except INPUT_ERRORS as e:
    mark(e)
    raise


def one_line(error: BaseException) -> str:
  """The message of `error` on one line (newlines and indents collapsed)."""
  text = ' '.join(str(error).split())
  return text or type(error).__name__
