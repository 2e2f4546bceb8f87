"""The runlocal timing command's table and doc update (no job is run)."""

import pytest

from lra_msmra_tools.benchmark import runlocal


def _report():
  return {'settings': {'date': '2026-01-01 00:00 UTC', 'machine': '2 CPU cores',
                       'load_start': '0.10', 'load_end': '0.20',
                       'commit': 'abcdef0123456789', 'command': 'cmd'},
          'records': [
              {'task': 'listops', 'config': 'cst', 'status': 'ok',
               'wall_seconds': 95.4, 'test_accuracy': 0.352, 'majority': 0.17,
               'steps': 1500, 'steps_per_sec': 21.04},
              {'task': 'pathx', 'config': 'adamra', 'status': 'ok',
               'wall_seconds': 400.0, 'test_accuracy': 0.5, 'majority': 0.54,
               'steps': 300, 'steps_per_sec': None},
              {'task': 'text', 'config': 'nope', 'status': 'no such config'}]}


def test_table_marks_slow_jobs_and_unlearned_tasks():
  table = runlocal.markdown(_report())
  assert '| listops | `cst` | 1:35 | 35.2% | 17.0% | yes (+18.2) | 1500 | 21.0 |' in table
  assert '6:40 (over 5:00)' in table and 'no (-4.0)' in table
  assert '| text | `nope` | — | no such config |' in table
  assert 'commit `abcdef0123`' in table and 'load average at start 0.10' in table


def test_doc_table_is_replaced_between_markers(tmp_path):
  doc = tmp_path / 'd.md'
  doc.write_text(f'intro\n{runlocal.BEGIN}\nold\n{runlocal.END}\noutro\n')
  runlocal.write_doc(str(doc), 'NEW TABLE')
  assert doc.read_text() == (f'intro\n{runlocal.BEGIN}\nNEW TABLE\n'
                             f'{runlocal.END}\noutro\n')
  bare = tmp_path / 'bare.md'
  bare.write_text('no markers')
  with pytest.raises(SystemExit, match='markers'):
    runlocal.write_doc(str(bare), 'x')


def test_missing_config_is_reported_not_run(tmp_path):
  record = runlocal.run_job('listops', 'no_such_config', str(tmp_path), 10)
  assert record['status'] == 'no such config'


def test_a_partial_run_says_what_it_left_out():
  report = _report()
  report['settings'].update(tasks=['listops', 'text'], configs=['cst'])
  table = runlocal.markdown(report)
  assert ('A partial run: 2 of the 30 jobs of the full command (tasks '
          'listops, text; configs cst). The other jobs are not measured at '
          'this commit.') in table
  report['settings'].update(tasks=list(runlocal.TASKS),
                            configs=list(runlocal.MECHANISMS))
  assert 'partial' not in runlocal.markdown(report)


def test_a_stopped_run_keeps_its_jobs_and_its_table_says_so(tmp_path, capsys):
  report = _report()
  report['settings'].update(tasks=list(runlocal.TASKS),
                            configs=list(runlocal.MECHANISMS))
  del report['settings']['load_end']  # Written when the command ends.
  path = tmp_path / 'runlocal.json'
  path.write_text(runlocal.json.dumps(report))
  doc = tmp_path / 'd.md'
  doc.write_text(f'{runlocal.BEGIN}\nold\n{runlocal.END}\n')
  assert runlocal.main(['--out', str(tmp_path / 'unused'), '--from_report',
                        str(path), '--doc', str(doc)]) == 0
  text = doc.read_text()
  assert ('An unfinished run: the command was stopped after 3 of its 30 '
          'jobs; the table has those.') in text
  assert 'at end —' in text and '| listops | `cst` | 1:35 |' in text
  assert not (tmp_path / 'unused').exists()  # Nothing was run.
  assert 'An unfinished run' in capsys.readouterr().out
