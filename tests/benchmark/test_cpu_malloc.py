"""The huge page setting for XLA:CPU's buffers: reading and building it
(lra_msmra_tools/benchmark/cpu_malloc.py; the readers live in provenance.py)."""

import subprocess
import sys

from lra_msmra_tools.benchmark import cpu_malloc


def test_the_tunable_is_read_from_glibc_tunables():
  assert cpu_malloc.hugetlb_value({}) is None
  one = {'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'}
  assert cpu_malloc.hugetlb_value(one) == '1'
  env = {'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2'
                           ':glibc.malloc.hugetlb=2'}
  assert cpu_malloc.hugetlb_value(env) == '2'  # The last one, as glibc.
  assert cpu_malloc.hugetlb_value(
      {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2'}) is None


def test_with_hugepages_keeps_other_tunables_and_replaces_its_own():
  env = cpu_malloc.with_hugepages({'PATH': '/bin'})
  assert env == {'PATH': '/bin', 'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'}
  env = cpu_malloc.with_hugepages(
      {'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2'})
  assert env['GLIBC_TUNABLES'] == ('glibc.malloc.arena_max=2:'
                                   'glibc.malloc.hugetlb=1')


def test_thp_mode_is_the_bracketed_word(tmp_path):
  path = tmp_path / 'enabled'
  path.write_text('always [madvise] never\n')
  assert cpu_malloc.thp_mode(str(path)) == 'madvise'
  path.write_text('[always] madvise never\n')
  assert cpu_malloc.thp_mode(str(path)) == 'always'
  assert cpu_malloc.thp_mode(str(tmp_path / 'missing')) is None


def test_describe_reports_what_a_child_process_was_given():
  env = cpu_malloc.with_hugepages({'MALLOC_ARENA_MAX': '2'})
  out = subprocess.run(
      [sys.executable, '-c', 'import json, sys; '
       'from lra_msmra_tools.benchmark import cpu_malloc; '
       'print(json.dumps(cpu_malloc.describe())); '
       # The benchmarks' parent process reads it without JAX.
       'print("jax" in sys.modules)'],
      env=env, capture_output=True, text=True, check=True).stdout
  assert '"glibc_malloc_hugetlb": "1"' in out
  assert '"malloc_env": {"MALLOC_ARENA_MAX": "2"}' in out
  assert out.splitlines()[-1] == 'False'

