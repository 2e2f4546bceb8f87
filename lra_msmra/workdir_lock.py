"""One run per workdir: the `<workdir>/lock` file.

Two runs writing the same checkpoints, metrics and results would corrupt each
other's work without a sign, so a run takes the lock before it reads or
writes anything else in its workdir and removes it when it ends (normally,
on an error, on SIGTERM or Ctrl-C). With several processes only process 0
takes it; the workdir sits on a filesystem they share.

The lock is a small JSON file (process id, host, start time, command) created
atomically (`O_CREAT | O_EXCL`): of two runs starting together exactly one
gets it. A run that finds a lock

* of a live process on this machine refuses, naming its process id and host;
* of a process that no longer runs on this machine (a killed run: SIGKILL,
  out of memory, a crash of the machine) replaces it, saying so in one line,
  so the same command resumes as before;
* written on another machine (or in another container, whose processes this
  one cannot see) refuses too: whether that process still runs cannot be
  checked from here. The message says which file to delete if the user
  knows that run is gone.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
import uuid
from typing import Any, Optional

LOCK_FILE = 'lock'
# An empty or unreadable lock younger than this may be one being written
# right now by a run that is starting; older, it is a leftover.
_UNREADABLE_GRACE_SECONDS = 30.0
# Tokens of the locks this process holds.
_HELD: set[str] = set()


class WorkdirLocked(RuntimeError):
  """Another run holds the workdir (the message names it and the fix)."""


def _process_start(pid: int) -> Optional[str]:
  """When `pid` started, in clock ticks since boot (Linux), else None."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      stat = f.read()
  except OSError:
    return None
  fields = stat[stat.rfind(')') + 2:].split()
  return fields[19] if len(fields) > 19 else None  # Field 22 of stat(5).


def _pid_namespace() -> Optional[str]:
  """Identifies the set of processes this one can see (its pid namespace)."""
  try:
    return os.readlink('/proc/self/ns/pid')
  except OSError:
    return None


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Someone else's process: it exists.
    return True
  except OSError:
    return True
  return True


def _describe(holder: dict[str, Any]) -> str:
  return (f'process {holder.get("pid", "?")} on host '
          f'{holder.get("host", "?")} (started {holder.get("started", "?")}'
          f': {holder.get("command", "?")})')


class WorkdirLock:
  """The lock of one workdir; `acquire()` then `release()`."""

  def __init__(self, workdir: str, command: Optional[str] = None):
    self.path = os.path.join(workdir, LOCK_FILE)
    self.workdir = workdir
    self._token = uuid.uuid4().hex
    self._held = False
    self._command = command or shlex.join([sys.executable] + sys.argv)

  def _record(self) -> dict[str, Any]:
    pid = os.getpid()
    return {'pid': pid, 'host': socket.gethostname(),
            'started': time.strftime('%Y-%m-%d %H:%M:%S %z'),
            'command': self._command, 'process_start': _process_start(pid),
            'pid_namespace': _pid_namespace(), 'token': self._token}

  def _stale_reason(self, holder: Optional[dict[str, Any]], age: float
                    ) -> Optional[str]:
    """Why a found lock is a leftover, or None if it may be held."""
    if holder is None:
      if age > _UNREADABLE_GRACE_SECONDS:
        return f'an unreadable lock file, {age:.0f} s old'
      return None
    if (holder.get('host') != socket.gethostname() or
        holder.get('pid_namespace') != _pid_namespace()):
      return None  # Not a process this one can see.
    pid = holder.get('pid')
    if not isinstance(pid, int):
      return 'a lock without a process id'
    if pid == os.getpid():
      if holder.get('token') in _HELD:
        return None  # Held by another run in this very process.
      # An earlier process had our process id (e.g. a restarted container).
      return f'left by an earlier process {pid}'
    if not _alive(pid):
      return f'process {pid} is no longer running'
    recorded, now = holder.get('process_start'), _process_start(pid)
    if recorded is not None and now is not None and recorded != now:
      return f'process id {pid} now belongs to another process'
    return None

  def _refusal(self, holder: Optional[dict[str, Any]]) -> str:
    if holder is None:
      return (f'{self.path} exists but is unreadable: another run may be '
              'starting in this workdir. If none is, delete that file and '
              'run again.')
    same_machine = (holder.get('host') == socket.gethostname() and
                    holder.get('pid_namespace') == _pid_namespace())
    if same_machine:
      return (f'Another run is using {self.workdir}: {_describe(holder)}. '
              'Wait for it to end or stop it (SIGTERM or Ctrl-C saves a '
              'checkpoint), or use another --workdir.')
    return (f'{self.workdir} is locked by {_describe(holder)}, which cannot '
            'be checked from this machine. If that run is over, delete '
            f'{self.path} and run again; otherwise use another --workdir.')

  def acquire(self) -> Optional[str]:
    """Takes the lock; returns a line saying a stale lock was replaced.

    Raises:
      WorkdirLocked: another run may hold it.
    """
    replaced = None
    for _ in range(3):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder, raw, age = self._read()
        if raw is None:  # Released meanwhile: try again.
          continue
        reason = self._stale_reason(holder, age)
        if reason is None:
          raise WorkdirLocked(self._refusal(holder)) from None
        if self._remove_if_unchanged(raw):
          replaced = (f'Replaced a stale lock in {self.workdir} ('
                      f'{reason}' + (f'; it was {_describe(holder)})'
                                     if holder else ')') + '.')
        continue
      with os.fdopen(fd, 'w') as f:
        json.dump(self._record(), f, indent=2)
        f.flush()
        os.fsync(f.fileno())
      self._held = True
      _HELD.add(self._token)
      return replaced
    raise WorkdirLocked(f'Could not take {self.path}: other runs keep '
                        'creating it. Is another run starting in this '
                        'workdir?')

  def _read(self) -> tuple[Optional[dict[str, Any]], Optional[bytes], float]:
    """(parsed lock or None, its bytes or None if there is no lock, its age
    in seconds)."""
    try:
      with open(self.path, 'rb') as f:
        raw = f.read()
      age = time.time() - os.path.getmtime(self.path)
    except FileNotFoundError:
      return None, None, 0.0
    try:
      holder = json.loads(raw)
    except ValueError:
      return None, raw, age
    return (holder if isinstance(holder, dict) else None), raw, age

  def _remove_if_unchanged(self, raw: bytes) -> bool:
    """Removes the lock if it still holds `raw` (not one another run just
    took); returns whether it was removed."""
    aside = f'{self.path}.stale.{os.getpid()}'
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:
      return False
    with open(aside, 'rb') as f:
      unchanged = f.read() == raw
    if unchanged:
      os.remove(aside)
      return True
    # Another run replaced the stale lock first: put its lock back.
    try:
      os.link(aside, self.path)
    except FileExistsError:
      pass
    os.remove(aside)
    return False

  def release(self) -> None:
    """Removes the lock if this object holds it (idempotent)."""
    if not self._held:
      return
    self._held = False
    _HELD.discard(self._token)
    holder, _, _ = self._read()
    if holder is not None and holder.get('token') == self._token:
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass
