"""Where a result comes from, also without a git checkout."""

import os
import shutil

from lra_msmra import provenance

PACKAGE = os.path.dirname(os.path.abspath(provenance.__file__))


def test_source_digest_names_the_code_without_git(tmp_path):
  copy = tmp_path / 'lra_msmra'
  shutil.copytree(PACKAGE, copy,
                  ignore=shutil.ignore_patterns('__pycache__'))
  # A copied tree (no git) has the package's digest, and no commit.
  assert provenance.source_digest(str(copy)) == provenance.source_digest()
  assert provenance.git_commit(str(copy)) == {}
  # Caches and other files do not count; any change to a source does.
  (copy / '__pycache__').mkdir(exist_ok=True)
  (copy / '__pycache__' / 'x.pyc').write_bytes(b'\0')
  (copy / 'notes.txt').write_text('not code')
  assert provenance.source_digest(str(copy)) == provenance.source_digest()
  models = copy / 'models.py'
  models.write_text(models.read_text() + '\n')
  assert provenance.source_digest(str(copy)) != provenance.source_digest()
  # A renamed file changes it too.
  models.rename(copy / 'models2.py')
  assert provenance.source_digest(str(copy)) != provenance.source_digest()


def test_history_entries_name_each_process_steps():
  cpu = {'platform': 'cpu', 'device_kind': 'cpu', 'num_devices': 1}
  gpu = {'platform': 'gpu', 'device_kind': 'H100', 'num_devices': 1}
  first = provenance.extend_history([], cpu, 0, 250)
  assert first == [dict(cpu, from_step=0, to_step=250)]
  both = provenance.extend_history(first, gpu, 250, 500)
  assert both == [dict(cpu, from_step=0, to_step=250),
                  dict(gpu, from_step=250, to_step=500)]
  assert first == [dict(cpu, from_step=0, to_step=250)]  # Not modified.
