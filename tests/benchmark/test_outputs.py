"""The benchmarks' plots: titles that fit and say only what is drawn, and
legends beside the panels."""

import pytest

from lra_msmra_tools import reporting
from lra_msmra_tools.benchmark import attention
from lra_msmra_tools.benchmark import outputs

LENGTHS = [1024, 2048, 4096]


def _report(backends, modes=('fwd_bwd',), drawn=None):
  """An attention report: every backend has records, those of `drawn`
  (default: all) were measured, the others skipped."""
  drawn = backends if drawn is None else drawn
  records = []
  for m in ('softmax', 'cst'):
    for backend in backends:
      for mode in modes:
        for i, n in enumerate(LENGTHS):
          ok = backend in drawn
          records.append({'mechanism': m, 'backend': backend, 'mode': mode,
                          'length': n, 'status': 'ok' if ok else 'skipped',
                          'time_s': 0.1 * 2 ** i if ok else None,
                          'net_peak_bytes': 2 ** (27 + i) if ok else None})
  settings = {'batch': 4, 'features': 256, 'heads': 4, 'dtype': 'float32',
              'modes': list(modes), 'mechanisms': ['softmax', 'cst'],
              'backends': list(backends), 'lengths': LENGTHS}
  return {'settings': settings, 'records': records}


@pytest.fixture
def figures(monkeypatch):
  """The figures the plot functions close, kept open for inspection."""
  kept = []
  plt = reporting.pyplot()
  monkeypatch.setattr(plt, 'close', kept.append)
  yield kept
  monkeypatch.undo()
  for fig in kept:
    plt.close(fig)


@pytest.mark.parametrize('backends,drawn,key', [
    (['jax'], None, ''),
    # PyTorch asked for but not measured: its lines are not drawn.
    (['jax', 'torch'], ['jax'], ''),
    (['jax', 'torch'], None, ' (solid: JAX, dashed: our PyTorch port)'),
    (['jax', 'torch', 'official'], ['jax', 'official'],
     ' (solid: JAX, dotted: official code)'),
])
def test_the_title_names_only_the_line_styles_drawn(tmp_path, figures,
                                                     backends, drawn, key):
  attention.plot(_report(backends, drawn=drawn), str(tmp_path))
  assert len(figures) == 2  # Time and memory.
  for fig in figures:
    assert fig._suptitle.get_text().replace('\n', ' ') == (  # pylint: disable=protected-access
        f'batch 4, D=256, 4 heads, float32{key}')
    styles = {line.get_linestyle() for ax in fig.axes
              for line in ax.get_lines()}
    assert len(styles) == max(1, key.count(':'))


@pytest.mark.parametrize('modes', [('fwd_bwd',), ('fwd', 'fwd_bwd')])
def test_the_title_fits_and_the_legend_is_beside_the_panels(tmp_path,
                                                            figures, modes):
  # One panel: the longest title, three backends drawn, must wrap.
  attention.plot(_report(['jax', 'torch', 'official'], modes=modes),
                 str(tmp_path))
  for fig in figures:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)  # pylint: disable=protected-access
    width = fig.get_figwidth() * fig.dpi
    assert 0 <= title.x0 and title.x1 <= width
    [legend] = fig.legends
    assert len(legend.get_texts()) == 6  # Every line once.
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
      assert ax.get_legend() is None
      assert box.x0 >= ax.get_window_extent(renderer).x1


def test_plot_panels_writes_a_png(tmp_path):
  path = tmp_path / 'p.png'
  outputs.plot_panels(str(path), [{'title': 't', 'ylabel': 'y', 'series': [
      {'label': 'a', 'points': [(1, 1.0), (2, None), (4, 3.0)],
       'color_key': 'a'}]}], 'x', 'a title')
  assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('memory', [(20.5, 24.0, 38.0), (3.0, 40.0, 900.0)])
def test_axes_read_in_plain_numbers_with_several_labelled_ticks(figures,
                                                                tmp_path,
                                                                memory):
  outputs.plot_panels(str(tmp_path / 'p.png'), [
      {'title': 'memory', 'ylabel': 'MiB', 'series': [
          {'label': 'a', 'points': list(zip((256, 512, 1024), memory)),
           'color_key': 'a'}]}], 'sequence length', 'a title')
  [fig] = figures
  fig.canvas.draw()
  [ax] = fig.axes
  low, high = ax.get_ylim()
  y_labels = [t.get_text() for t in ax.yaxis.get_ticklabels(which='both')
              if t.get_text() and low <= t.get_position()[1] <= high]
  x_labels = [t.get_text() for t in ax.xaxis.get_ticklabels(which='both')
              if t.get_text()]
  assert x_labels == ['256', '512', '1,024']
  assert len(y_labels) >= 3, y_labels
  for label in y_labels:
    float(label.replace(',', ''))  # Plain numbers: no 2×10^1, no 2^8.
