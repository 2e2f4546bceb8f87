r"""Pathfinder and Path-X images: a seeded implementation of the generator.

LRA's Pathfinder images come from the generator of Kim, Linsley et al.
(ICLR 2020, github.com/drewlinsley/pathfinder, `snakes2.py` with helpers in
`snakes.py`), run with the settings LRA lists per resolution in the
docstrings of `lra_benchmarks/data/pathfinder.py` (docs/protocol.md §7.3).
This module implements that algorithm in NumPy, step for step:

1. Two target snakes start `seed_distance` apart: the first paddle of the
   first snake is placed uniformly among the positions where it fits (away
   from the border band of width `2 * seed_distance`), the second one
   `seed_distance` away in a random direction.
2. Both grow one paddle at a time, alternately, to `contour_length`
   paddles. A paddle is `paddle_length` long and `paddle_thickness` thick;
   consecutive paddles are `2 * margin` apart. The next paddle's far end is
   drawn among the pixels of a circle around the growth point, weighted by
   continuity (`cos(min(continuity * turn, 90 deg)) ** 2`) and by how free
   the pixel is; a paddle that would overlap a drawn one (summed occupancy
   >= 1.8) is redrawn, at most `max_paddle_retrial` times, and a snake that
   cannot grow restarts both snakes.
3. `num_distractor_snakes` distractor snakes of `distractor_length` paddles
   are added the same way (a distractor that fails is retried, then
   skipped; none are seeded once less than 1% of the image is free).
4. Markers (discs of `marker_radius`) sit on the first end of one target
   snake and on the last end of the same snake (label 1) or of the other one
   (label 0).
5. Every paddle and marker is drawn at `antialias_scale` times the
   resolution and downsampled with 8-bit Lanczos resampling, as the
   official code does through SciPy's old `imresize`; the image is scaled so
   that its brightest pixel is 255, as SciPy's old `imsave` did.

The generator's quirks are kept, because they shape the images: the mask of
a snake's newest paddle joins the occupancy mask one step late (so a paddle
never collides with its predecessor), only the second target snake's last
paddle is added at the end, the second target seed is not checked against
the first, the dilation structure of a seed is the paddle mask's saturated
pixels, seed directions whose structure OpenCV's border handling makes
unplaceable fail (at 32x32 all but 30 of 360, see `_Geometry.seed_kernel`),
and at 32x32 the distractors (contrast 2.0) are brighter than the targets
(0.75 * 2.0), which are brighter than the markers (1.0) before the final
scaling.

Where we differ (docs/protocol.md §7.3):
* Seeded: image `n` of a set depends only on (seed, resolution,
  difficulty, n), through its own PCG64 stream, so any image can be
  regenerated alone and a set is the same on every machine and for any
  number of workers. The official code draws from NumPy's global, unseeded
  state.
* Random draws: the same distributions, not the same stream. The first
  paddle of a snake is drawn uniformly among the free positions by
  rejection (falling back to the full list of free positions), which gives
  the same distribution as the official draw from that list.
* The continuity weights are rounded to 12 decimals, so that the draws do
  not depend on the last bit of the C library's cosine.
* Python 2 arithmetic where LRA's settings rely on it: `contour_length / 3`
  and `budget / distractor_length` are integer divisions.
* A target pair that cannot be placed in MAX_TARGET_ATTEMPTS tries raises
  instead of looping forever.

Rasterisation follows the libraries the official code ran on (Pillow's line
and polygon fill, OpenCV's dilation, Pillow's fixed-point Lanczos filter,
SciPy's scaling to 0..255): our paddles, occupancy masks, seed structures,
next-paddle circles and markers equal the official functions' output bit
for bit. docs/protocol.md §7.4 compares the images with the official
generator's.

Settings: `settings(resolution, difficulty)`; Path-X follows the distractor
count given for the released data in LRA issue #38 (`PATHX_DISTRACTORS`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Optional

import numpy as np

# The difficulty folders of the release and their contour lengths: 'hard'
# and 'intermediate' from the folder names, 'easy' (curv_baseline) from the
# official wrapper's baseline condition.
CONTOUR_LENGTHS = {'easy': 6, 'intermediate': 9, 'hard': 14}
# Path-X distractor budget (LRA issue #38, docs/protocol.md §7.3): the
# builder docstring gives 35 / distractor_length; the released data used
# twice as many. 'documented' is kept for comparison.
PATHX_DISTRACTORS = {'release': 70, 'documented': 35}
# Restarts of the two target snakes before an image is given up (the
# official generator retries forever).
MAX_TARGET_ATTEMPTS = 10_000
# Rejection draws of a seed position before the free positions are listed.
SEED_REJECTION_DRAWS = 24
# Bumped whenever the images of a given seed change.
VERSION = 1
DIFFICULTY_CODES = {'easy': 0, 'intermediate': 1, 'hard': 2}


@dataclasses.dataclass(frozen=True)
class Settings:
  """One set's generator settings (the official `Args`, LRA's values).

  Attributes:
    resolution: images are `resolution x resolution`.
    contour_length: paddles per target snake.
    distractor_length: paddles per distractor snake.
    num_distractor_snakes: distractor snakes per image (before failures).
    paddle_length: paddle length in pixels.
    paddle_thickness: paddle thickness in pixels (times `antialias_scale`
      must be an integer).
    paddle_margins: half the gap between paddles; one is drawn per image.
    continuity: how straight snakes are (larger = straighter).
    seed_distance: distance between the first paddles of the two targets.
    marker_radius: marker disc radius in pixels.
    padding: border width where nothing is seeded.
    antialias_scale: drawing resolution factor before downsampling.
    snake_contrasts: contrast of a snake, one drawn per snake.
    paddle_contrasts: contrast factor of a target paddle, one per step.
    max_paddle_retrial: redraws of a colliding paddle, and of a seed whose
      paddle leaves the image.
    max_distractor_retrial: retries of a distractor snake.
    min_free_fraction: no distractor is seeded below this free fraction.
  """
  resolution: int
  contour_length: int
  distractor_length: int
  num_distractor_snakes: int
  paddle_length: int
  paddle_thickness: float
  paddle_margins: tuple[int, ...]
  continuity: float
  seed_distance: int
  marker_radius: float
  padding: int = 1
  antialias_scale: int = 2
  snake_contrasts: tuple[float, ...] = (1.0,)
  paddle_contrasts: tuple[float, ...] = (1.0,)
  max_paddle_retrial: int = 2
  max_distractor_retrial: int = 4
  min_free_fraction: float = 0.01

  def to_dict(self) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(self).items()}


def settings(resolution: int, difficulty: str,
             pathx_distractors: str = 'release') -> Settings:
  """LRA's generator settings for one resolution and difficulty.

  32x32: every difficulty (LRA's Pathfinder is 'hard'). 128x128: 'hard' is
  Path-X; the other difficulties use the same settings with their contour
  length. The distractor budget (20 at 32, 35 or 70 at 128, see
  `PATHX_DISTRACTORS`) is divided by each difficulty's distractor length.

  Raises:
    ValueError: an unknown resolution, difficulty or distractor choice.
  """
  if difficulty not in CONTOUR_LENGTHS:
    raise ValueError(f'difficulty {difficulty!r}; valid: '
                     f'{sorted(CONTOUR_LENGTHS)}.')
  if pathx_distractors not in PATHX_DISTRACTORS:
    raise ValueError(f'pathx_distractors {pathx_distractors!r}; valid: '
                     f'{sorted(PATHX_DISTRACTORS)}.')
  contour = CONTOUR_LENGTHS[difficulty]
  distractor = contour // 3  # Python 2's `/` in the official settings.
  if resolution == 32:
    return Settings(
        resolution=32, contour_length=contour, distractor_length=distractor,
        num_distractor_snakes=20 // distractor, paddle_length=2,
        paddle_thickness=0.5, paddle_margins=(1,), continuity=1.0,
        seed_distance=7, marker_radius=1.5, snake_contrasts=(2.0,),
        paddle_contrasts=(0.75,))
  if resolution == 128:
    return Settings(
        resolution=128, contour_length=contour,
        distractor_length=distractor,
        num_distractor_snakes=(PATHX_DISTRACTORS[pathx_distractors] //
                               distractor),
        paddle_length=5, paddle_thickness=1.5, paddle_margins=(2, 3),
        continuity=1.8, seed_distance=20, marker_radius=3.0,
        snake_contrasts=(0.9,))
  raise ValueError(f'resolution {resolution}: the generator has LRA\'s '
                   'settings for 32 (Pathfinder) and 128 (Path-X).')


# ------------------------------------------------------------ random draws


class _Random:
  """Uniform draws from one PCG64 stream (integers by Lemire's method, floats
  from 53 bits), so the images do not depend on NumPy's `Generator`
  algorithms, which may change between versions."""

  _BLOCK = 64

  def __init__(self, entropy: list[int]):
    self._raw = np.random.PCG64(np.random.SeedSequence(entropy)).random_raw
    self._buffer: list[int] = []

  def _next(self) -> int:
    if not self._buffer:
      self._buffer = self._raw(self._BLOCK).tolist()[::-1]
    return self._buffer.pop()

  def below(self, n: int) -> int:
    """Uniform integer in [0, n)."""
    while True:
      product = self._next() * n
      low = product & 0xFFFFFFFFFFFFFFFF
      if low >= n or low >= (-n) % n:
        return product >> 64

  def uniform(self) -> float:
    """Uniform float in [0, 1)."""
    return (self._next() >> 11) * 2.0 ** -53


def image_entropy(seed: int, resolution: int, difficulty: str,
                  index: int) -> list[int]:
  """The SeedSequence entropy of one image."""
  return [VERSION, seed, resolution, DIFFICULTY_CODES[difficulty], index]


# ------------------------------------------------- geometry and rasterising


@functools.lru_cache(maxsize=None)
def _sin_cos(theta: float) -> tuple[float, float]:
  return math.sin(theta), math.cos(theta)


def _translate(y: int, x: int, theta: float, dist: float) -> tuple[int, int]:
  """The official `translate_coord`: move by `dist` along `theta`, round
  both coordinates up."""
  s, c = _sin_cos(theta)
  return math.ceil(y + float(dist) * s), math.ceil(x + float(dist) * c)


def _flip(theta: float) -> float:
  """`theta` turned by half a turn, in (-pi, pi]."""
  return theta + math.pi if theta < 0 else theta - math.pi


def _disc_offsets(radius: float) -> np.ndarray:
  """`[n, 2]` (dy, dx) with dy^2 + dx^2 <= radius^2 (row-major order)."""
  r = int(math.floor(radius))
  dy, dx = np.mgrid[-r:r + 1, -r:r + 1]
  keep = dy ** 2 + dx ** 2 <= radius ** 2
  return np.stack([dy[keep], dx[keep]], axis=1)


def _bresenham(canvas: np.ndarray, x0: int, y0: int, x1: int, y1: int
               ) -> None:
  """A one-pixel line as Pillow draws it, both ends included."""
  h, w = canvas.shape

  def point(x, y):
    if 0 <= x < w and 0 <= y < h:
      canvas[y, x] = True

  dx, xs = (x1 - x0, 1) if x1 >= x0 else (x0 - x1, -1)
  dy, ys = (y1 - y0, 1) if y1 >= y0 else (y0 - y1, -1)
  if dx == 0 or dy == 0:
    for _ in range(dx + dy):
      point(x0, y0)
      x0 += xs if dy == 0 else 0
      y0 += ys if dx == 0 else 0
  elif dx > dy:
    e = 2 * dy - dx
    for _ in range(dx):
      point(x0, y0)
      if e >= 0:
        y0 += ys
        e -= 2 * dx
      e += 2 * dy
      x0 += xs
  else:
    e = 2 * dx - dy
    for _ in range(dy):
      point(x0, y0)
      if e >= 0:
        x0 += xs
        e -= 2 * dy
      e += 2 * dx
      y0 += ys
  point(x1, y1)


def _round_up(f: float) -> int:
  """Pillow's ROUND_UP, half away from zero, in `f`'s precision (float32
  for scanline crossings, float64 otherwise)."""
  half = np.float32(0.5) if isinstance(f, np.float32) else 0.5
  return int(math.floor(f + half)) if f >= 0 else -int(
      math.floor(abs(f) + half))


def _round_down(f: float) -> int:
  """Pillow's ROUND_DOWN, half toward zero, in `f`'s precision."""
  half = np.float32(0.5) if isinstance(f, np.float32) else 0.5
  return int(math.ceil(f - half)) if f >= 0 else -int(
      math.ceil(abs(f) - half))


def _wide_line(canvas: np.ndarray, x0: int, y0: int, x1: int, y1: int,
               width: int) -> None:
  """A line `width` pixels wide as Pillow draws it: a quadrilateral with
  integer corners, filled scanline by scanline in single precision."""
  dx, dy = x1 - x0, y1 - y0
  h, w = canvas.shape
  if dx == 0 and dy == 0:
    if 0 <= x0 < w and 0 <= y0 < h:
      canvas[y0, x0] = True
    return
  big = math.sqrt(dx * dx + dy * dy)
  small = (width - 1) / 2.0
  ratio_max = _round_up(small) / big
  ratio_min = _round_down(small) / big
  dxmin, dxmax = _round_down(ratio_min * dy), _round_down(ratio_max * dy)
  dymin, dymax = _round_down(ratio_min * dx), _round_down(ratio_max * dx)
  corners = [(x0 - dxmin, y0 + dymax), (x1 - dxmin, y1 + dymax),
             (x1 + dxmax, y1 - dymin), (x0 + dxmax, y0 - dymin)]

  def hline(xa, y, xb):
    if 0 <= y < h:
      xa, xb = min(xa, xb), max(xa, xb)
      xa, xb = max(xa, 0), min(xb, w - 1)
      if xa <= xb:
        canvas[y, xa:xb + 1] = True

  edges = []
  for (xa, ya), (xb, yb) in zip(corners, corners[1:] + corners[:1]):
    if ya == yb:  # Pillow draws horizontal edges directly.
      hline(min(xa, xb), ya, max(xa, xb))
      continue
    slope = np.float32(np.float32(xb - xa) / np.float32(yb - ya))
    edges.append((min(ya, yb), max(ya, yb), xa, ya, slope))
  if not edges:
    return
  ymin = max(min(e[0] for e in edges), 0)
  ymax = min(max(e[1] for e in edges), h)
  for y in range(ymin, ymax + 1):
    xs = []
    for lo, hi, xa, ya, slope in edges:
      if lo <= y <= hi:
        xs.append(np.float32(np.float32(y - ya) * slope) + np.float32(xa))
      if y == hi and y < ymax:
        xs.append(xs[-1])
    xs.sort()
    for i in range(1, len(xs), 2):
      hline(_round_up(xs[i - 1]), y, _round_down(xs[i]))


def _lanczos(x: float) -> float:
  if not -3.0 <= x < 3.0:
    return 0.0

  def sinc(v):
    return 1.0 if v == 0.0 else math.sin(v * math.pi) / (v * math.pi)

  return sinc(x) * sinc(x / 3)


PRECISION_BITS = 22  # Pillow's fixed point for 8-bit resampling.


@functools.lru_cache(maxsize=None)
def _resize_matrix(in_size: int, out_size: int) -> np.ndarray:
  """`[out, in]` int64 fixed-point Lanczos weights of one axis, as Pillow
  computes them for 8-bit images (support 3 * scale, renormalised at the
  borders)."""
  scale = in_size / out_size
  filterscale = max(scale, 1.0)
  support = 3.0 * filterscale
  out = np.zeros((out_size, in_size), np.int64)
  for xx in range(out_size):
    center = (xx + 0.5) * scale
    xmin = max(int(center - support + 0.5), 0)
    xmax = min(int(center + support + 0.5), in_size) - xmin
    weights = [_lanczos((x + xmin - center + 0.5) / filterscale)
               for x in range(xmax)]
    total = sum(weights)
    for x, wt in enumerate(weights):
      wt = wt / total if total != 0.0 else wt
      out[xx, xmin + x] = int((-0.5 if wt < 0 else 0.5) +
                              wt * (1 << PRECISION_BITS))
  return out


def _clip8(acc: np.ndarray) -> np.ndarray:
  return np.clip((acc + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS, 0,
                 255)


def _resize(image: np.ndarray, rows: np.ndarray, cols: np.ndarray
            ) -> np.ndarray:
  """Pillow's 8-bit resampling: horizontal pass, 8-bit rounding, vertical
  pass. `image` int64 in 0..255; `rows`/`cols` from `_resize_matrix`."""
  return _clip8(rows @ _clip8(image @ cols.T))


def _dilate(binary: np.ndarray, offsets: np.ndarray) -> np.ndarray:
  """OpenCV's dilation of a 0/1 image by a structuring element given as
  offsets from its anchor; pixels outside the image do not count."""
  h, w = binary.shape
  r = int(np.abs(offsets).max()) if len(offsets) else 0
  padded = np.zeros((h + 2 * r, w + 2 * r), bool)
  padded[r:r + h, r:r + w] = binary
  out = np.zeros((h, w), bool)
  for dy, dx in offsets:
    out |= padded[r + dy:r + dy + h, r + dx:r + dx + w]
  return out


def _grey_dilate(image: np.ndarray, offsets: np.ndarray, grow: int
                 ) -> np.ndarray:
  """Maximum of `image` over `offsets` around each pixel, on the image
  grown by `grow` pixels on every side (outside pixels count as 0)."""
  h, w = image.shape
  padded = np.zeros((h + 4 * grow, w + 4 * grow))
  padded[2 * grow:2 * grow + h, 2 * grow:2 * grow + w] = image
  out = np.zeros((h + 2 * grow, w + 2 * grow))
  for dy, dx in offsets:
    np.maximum(out, padded[grow + dy:grow + dy + h + 2 * grow,
                           grow + dx:grow + dx + w + 2 * grow], out=out)
  return out


@dataclasses.dataclass
class _PaddleImage:
  """One paddle, drawn from the center of a `[2S + 1, 2S + 1]` patch.

  Attributes:
    line: uint8 downsampled paddle.
    mask: float64 (holding float32 values, as the official float32 canvas
      does) downsampled paddle dilated by the margin: what it occupies.
    kernel: `[n, 2]` offsets (from the anchor) of a seed's dilation
      structure in this direction; None until needed.
    dilated: `mask` dilated by the margin (maximum over a disc), `[2 (S +
      margin) + 1]` square: what the next-paddle draw reads.
    kernel: `[n, 2]` offsets (from the anchor) of a seed's dilation
      structure in this direction; None until needed.
    blind: whether the official code finds no seed in this direction (see
      `_Geometry.seed_kernel`).
  """
  line: np.ndarray
  mask: np.ndarray
  dilated: np.ndarray
  kernel: Optional[np.ndarray] = None
  blind: bool = False


class _Geometry:
  """What paddles of one margin look like, whatever the image: the paddle
  patch of each direction, the circle of next-paddle positions and its
  continuity weights, the dilation structures."""

  def __init__(self, s: Settings, margin: int):
    self.s, self.margin = s, margin
    aa, length = s.antialias_scale, s.paddle_length
    if round(s.paddle_thickness * aa) != s.paddle_thickness * aa:
      raise ValueError('paddle_thickness * antialias_scale must be an '
                       'integer.')
    self.half = length + math.ceil(s.paddle_thickness) + margin
    self.blown = 2 * self.half * aa + 1
    self.width = int(round(s.paddle_thickness * aa))
    self.resize = _resize_matrix(self.blown, 2 * self.half + 1)
    self.large = _disc_offsets(margin * aa)
    self.small = _disc_offsets(margin)
    self.reach = length + margin  # next paddle's far end from the pivot.
    self.advance = length + 2 * margin  # pivot to next pivot.
    self.anchor = length + margin  # center of a seed's structure.
    self._paddles: dict[float, _PaddleImage] = {}
    self._lines: dict[tuple[float, float], np.ndarray] = {}
    self._weights: dict[float, np.ndarray] = {}
    # The official candidates: the pixel (coordinates rounded down) of
    # each one-pixel arc step of the circle, deduplicated, sorted.
    step = 360.0 / (2 * self.reach * math.pi)
    offsets = set()
    for k in range(math.ceil(360.0 / step)):
      sin, cos = _sin_cos(k * step * math.pi / 180)
      offsets.add((math.floor(self.reach * sin),
                   math.floor(self.reach * cos)))
    self.circle = np.array(sorted(offsets), np.int64)
    self.circle_theta = np.array([math.atan2(dy, dx)
                                  for dy, dx in self.circle])

  def paddle(self, theta: float) -> _PaddleImage:
    """The paddle starting at the patch center in direction `theta`."""
    paddle = self._paddles.get(theta)
    if paddle is None:
      aa, c = self.s.antialias_scale, self.half * self.s.antialias_scale
      hy, hx = _translate(c, c, theta, self.s.paddle_length * aa)
      blown = np.zeros((self.blown, self.blown), bool)
      if self.width <= 1:
        _bresenham(blown, c, c, hx, hy)
      else:
        _wide_line(blown, c, c, hx, hy, self.width)
      line = _resize(blown.astype(np.int64) * 255, self.resize, self.resize)
      mask = _resize(_dilate(blown, self.large).astype(np.int64) * 255,
                     self.resize, self.resize)
      mask = (mask / 255.0).astype(np.float32).astype(np.float64)
      paddle = self._paddles[theta] = _PaddleImage(
          line=line.astype(np.uint8), mask=mask,
          dilated=_grey_dilate(mask, self.small, self.margin))
    return paddle

  def line(self, theta: float, contrast: float) -> np.ndarray:
    """The paddle's intensities times `contrast`, float32 values as the
    official canvas stores them."""
    line = self._lines.get((theta, contrast))
    if line is None:
      line = self._lines[theta, contrast] = (
          self.paddle(theta).line / 255.0 * contrast).astype(
              np.float32).astype(np.float64)
    return line

  def weights(self, theta: float) -> np.ndarray:
    """Continuity weight of each circle position after direction `theta`:
    cos(min(continuity * turn, 90 deg)) ** 2 (rounded to 12 decimals, so
    that the draws do not depend on the last bit of `cos`)."""
    w = self._weights.get(theta)
    if w is None:
      turn = np.abs(self.circle_theta - theta)
      turn = np.minimum(np.minimum(turn, 2 * np.pi - turn) *
                        self.s.continuity, 0.5 * np.pi)
      w = self._weights[theta] = np.round(np.maximum(np.cos(turn), 0) ** 2,
                                          12)
    return w

  def seed_kernel(self, theta: float) -> _PaddleImage:
    """The paddle of direction `theta` with its seed structure: the
    saturated pixels of the paddle mask drawn in a `2 anchor + 1` square
    from one pixel below and right of its center, which OpenCV anchors at
    the center.

    `blind` marks the directions where the official code finds no seed
    whatever the image: OpenCV pads with the lowest float value when
    dilating, so a pixel whose whole structure falls outside the image
    comes out negative when the structure misses one of the four quadrants
    around its anchor, and the official coordinate search returns nothing
    for a mask with a negative value.
    """
    paddle = self.paddle(theta)
    if paddle.kernel is None:
      n, start = 2 * self.anchor + 1, self.anchor + 1
      struct = np.zeros((n, n))
      _place(struct, paddle.mask, start, start, self.half, np.maximum)
      ys, xs = np.nonzero(struct >= 1.0)
      k = np.stack([ys, xs], 1) - self.anchor
      up, left, down, right = k[:, 0] <= 0, k[:, 1] <= 0, k[:, 0] >= 0, k[:, 1] >= 0
      paddle.blind = not ((up & left).any() and (up & right).any() and
                          (down & left).any() and (down & right).any())
      paddle.kernel = k
    return paddle


def _place(canvas: np.ndarray, patch: np.ndarray, y: int, x: int, half: int,
           op: Any) -> None:
  """canvas = op(canvas, patch centered at (y, x)), clipped to the canvas."""
  h, w = canvas.shape
  y0, x0, n = y - half, x - half, patch.shape[0]
  if y0 >= 0 and x0 >= 0 and y0 + n <= h and x0 + n <= w:
    region = canvas[y0:y0 + n, x0:x0 + n]
    op(region, patch, out=region)
    return
  ya, xa = max(y0, 0), max(x0, 0)
  yb, xb = min(y0 + n, h), min(x0 + n, w)
  if ya < yb and xa < xb:
    region = canvas[ya:yb, xa:xb]
    op(region, patch[ya - y0:yb - y0, xa - x0:xb - x0], out=region)


def _overlap(canvas: np.ndarray, patch: np.ndarray, y: int, x: int,
             half: int) -> float:
  """max(canvas + patch) over the patch's footprint (0 if none)."""
  h, w = canvas.shape
  y0, x0, n = y - half, x - half, patch.shape[0]
  if y0 >= 0 and x0 >= 0 and y0 + n <= h and x0 + n <= w:
    return float((canvas[y0:y0 + n, x0:x0 + n] + patch).max())
  ya, xa = max(y0, 0), max(x0, 0)
  yb, xb = min(y0 + n, h), min(x0 + n, w)
  if ya >= yb or xa >= xb:
    return 0.0
  return float((canvas[ya:yb, xa:xb] +
                patch[ya - y0:yb - y0, xa - x0:xb - x0]).max())


# --------------------------------------------------------------- the image


class _Canvas:
  """An image being drawn: its occupancy mask (float64 holding the official
  float32 values), the mask dilated by the margin, which the next-paddle
  draw reads (padded, so that the candidates around any growth point can be
  read without bounds checks), and the paddles drawn so far, painted only
  once the image is complete (painting takes the maximum, so the order
  does not matter, and most snakes are abandoned)."""

  def __init__(self, mask: np.ndarray, dilated: np.ndarray,
               paddles: list[tuple[np.ndarray, int, int]]):
    self.mask, self.dilated, self.paddles = mask, dilated, paddles
    self.pad = (dilated.shape[0] - mask.shape[0]) // 2
    self.flat = dilated.reshape(-1)

  def copy(self) -> '_Canvas':
    return _Canvas(self.mask.copy(), self.dilated.copy(), list(self.paddles))

  def occupy(self, paddle: _PaddleImage, y: int, x: int, g: '_Geometry'
             ) -> None:
    """Adds a paddle's mask at (y, x) (clipped to the image) and its
    dilation (which only touches pixels outside the image or within a
    margin of its border, already saturated by the padding, beyond it)."""
    _place(self.mask, paddle.mask, y, x, g.half, np.maximum)
    _place(self.dilated, paddle.dilated, y + self.pad, x + self.pad,
           g.half + g.margin, np.maximum)


@dataclasses.dataclass
class _Snake:
  """A growing snake.

  Attributes:
    pivot: growth point of the next paddle.
    theta: direction of growth.
    origin: start of the first paddle (a marker position).
    tip: far end of the newest paddle (a marker position once grown).
    last: newest paddle and its position; it joins the occupancy mask when
      the next paddle is drawn.
  """
  pivot: tuple[int, int]
  theta: float
  origin: tuple[int, int]
  tip: tuple[int, int]
  last: tuple[_PaddleImage, int, int]


class _Generator:
  """Draws the images of one `Settings`."""

  def __init__(self, s: Settings):
    self.s = s
    r, aa = s.resolution, s.antialias_scale
    self.geometry = {m: _Geometry(s, m) for m in s.paddle_margins}
    self.marker_resize = _resize_matrix(r * aa, r)
    self.marker_disc = _disc_offsets(s.marker_radius * aa)
    # A growth point lies at most margin + 1 pixels outside the image and
    # its candidates `reach` + 1 further.
    m = max(s.paddle_margins)
    self.pad = s.paddle_length + 2 * m + 3
    width = r + 2 * self.pad
    self.empty = np.zeros((r, r))
    p = s.padding
    self.empty[:p, :] = self.empty[-p:, :] = 1.0
    self.empty[:, :p] = self.empty[:, -p:] = 1.0
    self.empty_dilated = {}
    for margin, g in self.geometry.items():
      g.circle_flat = g.circle[:, 0] * width + g.circle[:, 1]
      self.empty_dilated[margin] = _grey_dilate(self.empty, g.small,
                                                self.pad)
    # The first target's seed avoids a band of twice the seed distance.
    band = 2 * s.seed_distance
    self.target_blocked = self.empty > 0.3
    self.target_blocked[:band, :] = self.target_blocked[r - band:, :] = True
    self.target_blocked[:, :band] = self.target_blocked[:, r - band:] = True
    self._target_free: dict[tuple[int, float], np.ndarray] = {}

  # -------------------------------------------------------------- seeding

  def _seed(self, rng: _Random, g: _Geometry, blocked: Any,
            ) -> Optional[tuple[int, int, float]]:
    """A seed paddle's start and direction, drawn as the official
    `seed_snake` draws them: a direction, then a free position (one where
    the direction's structure meets no blocked pixel); both are redrawn
    while the paddle's end or its growth point fall outside the image.

    Args:
      rng: the image's draws.
      g: the paddle geometry.
      blocked: bool `[R, R]` blocked pixels, or None for the first target
        (whose blocked pixels are fixed).
    """
    r = self.s.resolution
    for _ in range(self.s.max_paddle_retrial + 1):
      theta = (rng.below(360) - 180) * math.pi / 180
      paddle = g.seed_kernel(theta)
      if paddle.blind:
        return None
      if blocked is None:
        position = self._target_position(rng, g, theta, paddle.kernel)
      else:
        position = self._free_position(rng, blocked, paddle.kernel)
      if position is None:
        return None
      y, x = position
      head = _translate(y, x, theta, self.s.paddle_length)
      pivot = _translate(*head, _flip(theta), g.reach)
      if all(0 <= v < r for v in head + pivot):
        return y, x, theta
    return None

  def _target_position(self, rng: _Random, g: _Geometry, theta: float,
                       kernel: np.ndarray) -> Optional[tuple[int, int]]:
    """A uniform free position of the first target's seed."""
    key = (g.margin, theta)
    free = self._target_free.get(key)
    if free is None:
      free = self._target_free[key] = np.flatnonzero(
          ~_dilate(self.target_blocked, kernel))
    if not len(free):
      return None
    return divmod(int(free[rng.below(len(free))]), self.s.resolution)

  @staticmethod
  def _free_position(rng: _Random, blocked: np.ndarray, kernel: np.ndarray
                     ) -> Optional[tuple[int, int]]:
    """A uniform position p with no blocked pixel at p + kernel (pixels
    outside the image do not count), or None if there is none.

    Positions are first drawn over the whole image and kept if free, which
    is uniform over the free positions as the official draw from their
    list is; the list is made only after SEED_REJECTION_DRAWS misses.
    """
    h, w = blocked.shape
    ky, kx = kernel[:, 0], kernel[:, 1]
    for _ in range(SEED_REJECTION_DRAWS):
      y, x = divmod(rng.below(h * w), w)
      yy, xx = ky + y, kx + x
      inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
      if not blocked[yy[inside], xx[inside]].any():
        return y, x
    free = np.flatnonzero(~_dilate(blocked, kernel))
    if not len(free):
      return None
    return divmod(int(free[rng.below(len(free))]), w)

  def _start(self, g: _Geometry, canvas: _Canvas, y: int, x: int,
             theta: float, contrast: float) -> _Snake:
    """Draws a seed paddle; its mask joins the canvas mask one step
    later."""
    canvas.paddles.append((g.line(theta, contrast), y, x))
    head = _translate(y, x, theta, self.s.paddle_length)
    pivot = _translate(*head, _flip(theta), g.reach)
    return _Snake(pivot=pivot, theta=theta, origin=(y, x), tip=(y, x),
                  last=(g.paddle(theta), y, x))

  # -------------------------------------------------------------- growing

  def _extend(self, rng: _Random, g: _Geometry, canvas: _Canvas,
              snake: _Snake, contrast: float) -> bool:
    """Adds one paddle to `snake` (the official `extend_snake`)."""
    r, pad = self.s.resolution, canvas.pad
    py, px = _translate(*snake.pivot, snake.theta, g.advance)
    reach = g.reach
    index = (py + pad) * canvas.dilated.shape[1] + px + pad + g.circle_flat
    pmf = g.weights(snake.theta)
    first = 0
    if reach <= py < r - reach and reach <= px < r - reach:
      pmf = (1.0 - canvas.flat.take(index)) * pmf
    else:  # Candidates outside the image do not count.
      cy, cx = g.circle[:, 0] + py, g.circle[:, 1] + px
      inside = (cy >= 0) & (cy < r) & (cx >= 0) & (cx < r)
      if not inside.any():
        return False
      first = int(inside.argmax())
      pmf = (1.0 - canvas.flat.take(index, mode='clip')) * pmf * inside
    cmf = pmf.cumsum()
    total = cmf[-1]
    if total < 1e-4:
      return False
    for _ in range(self.s.max_paddle_retrial + 1):
      # The first position whose cumulative weight exceeds a uniform draw.
      above = cmf > rng.uniform() * total
      i = int(above.argmax())
      if not above[i]:  # The official argmax of all False: the first.
        i = first
      y, x = py + int(g.circle[i, 0]), px + int(g.circle[i, 1])
      back = _flip(float(g.circle_theta[i]))
      paddle = g.paddle(back)
      if _overlap(canvas.mask, paddle.mask, y, x, g.half) < 1.8:
        break
    else:
      return False
    canvas.paddles.append((g.line(back, contrast), y, x))
    canvas.occupy(*snake.last, g)
    snake.pivot, snake.theta = (py, px), float(g.circle_theta[i])
    snake.tip, snake.last = (y, x), (paddle, y, x)
    return True

  def _targets(self, rng: _Random, g: _Geometry
               ) -> Optional[tuple[_Canvas, list[_Snake]]]:
    """The two target snakes (the official `two_snakes`), or None."""
    s = self.s
    r = s.resolution
    n = len(s.snake_contrasts)
    mus = [s.snake_contrasts[i % n] for i in _permutation(rng, 2 * n)[:2]]
    contrast = s.paddle_contrasts[rng.below(len(s.paddle_contrasts))]
    first = self._seed(rng, g, None)
    if first is None:
      return None
    canvas = _Canvas(self.empty.copy(), self.empty_dilated[g.margin].copy(),
                     [])
    y1, x1, theta1 = first
    snakes = [self._start(g, canvas, y1, x1, theta1, contrast * mus[0])]
    contrast = s.paddle_contrasts[rng.below(len(s.paddle_contrasts))]
    for _ in range(s.max_paddle_retrial + 1):
      theta2 = (rng.below(360) - 180) * math.pi / 180
      sin, cos = _sin_cos(rng.below(360) * math.pi / 180)
      # NumPy's round: half to even, as Python's.
      y2 = int(round(y1 + s.seed_distance * sin))
      x2 = int(round(x1 + s.seed_distance * cos))
      head = _translate(y2, x2, theta2, s.paddle_length)
      pivot = _translate(*head, _flip(theta2), g.reach)
      if all(0 <= v < r for v in head + pivot):
        break
    else:
      return None
    snakes.append(self._start(g, canvas, y2, x2, theta2, contrast * mus[1]))
    for _ in range(s.contour_length - 1):
      contrast = s.paddle_contrasts[rng.below(len(s.paddle_contrasts))]
      for snake, mu in zip(snakes, mus):
        if not self._extend(rng, g, canvas, snake, contrast * mu):
          return None
    canvas.occupy(*snakes[1].last, g)  # The official code adds only this.
    return canvas, snakes

  def _distractor(self, rng: _Random, g: _Geometry, canvas: _Canvas
                  ) -> Optional[_Canvas]:
    """`canvas` with one more distractor snake (the official `make_snake`),
    or None."""
    s, r = self.s, self.s.resolution
    contrasts = s.snake_contrasts
    contrast = contrasts[rng.below(len(contrasts))]
    blocked = canvas.mask > 0.3
    if 1.0 - blocked.mean() < s.min_free_fraction:
      return None
    blocked[0, :] = blocked[r - 1, :] = True
    blocked[:, 0] = blocked[:, r - 1] = True
    seed = self._seed(rng, g, blocked)
    if seed is None:
      return None
    canvas = canvas.copy()
    snake = self._start(g, canvas, *seed, contrast)
    for _ in range(s.distractor_length - 1):
      contrast = contrasts[rng.below(len(contrasts))]
      if not self._extend(rng, g, canvas, snake, contrast):
        return None
    canvas.occupy(*snake.last, g)
    return canvas

  def _marker(self, y: int, x: int) -> np.ndarray:
    """The official `draw_circle`: a disc drawn at `antialias_scale` times
    the resolution and downsampled; int64 `[R, R]` in 0..255."""
    s = self.s
    r, aa = s.resolution, s.antialias_scale
    big = r * aa
    disc = self.marker_disc + (y * aa, x * aa)
    disc = disc[(disc[:, 0] >= 0) & (disc[:, 0] < big) & (disc[:, 1] >= 0) &
                (disc[:, 1] < big)]
    out = np.zeros((r, r), np.int64)
    if not len(disc):
      return out
    (ya, xa), (yb, xb) = disc.min(axis=0), disc.max(axis=0) + 1
    local = np.zeros((yb - ya, xb - xa), np.int64)
    local[disc[:, 0] - ya, disc[:, 1] - xa] = 255
    # Only the outputs whose filter window meets the disc.
    m = self.marker_resize
    rows = np.flatnonzero(m[:, ya:yb].any(axis=1))
    cols = np.flatnonzero(m[:, xa:xb].any(axis=1))
    rows, cols = slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1)
    out[rows, cols] = _resize(local, m[rows, ya:yb], m[cols, xa:xb])
    return out

  def image(self, rng: _Random) -> tuple[np.ndarray, int, int]:
    """One image: (uint8 `[R, R]`, label, paddle margin)."""
    s = self.s
    label = rng.below(2)
    margin = s.paddle_margins[rng.below(len(s.paddle_margins))]
    g = self.geometry[margin]
    for _ in range(MAX_TARGET_ATTEMPTS):
      targets = self._targets(rng, g)
      if targets is not None:
        break
    else:
      raise RuntimeError(f'No pair of target snakes fits after '
                         f'{MAX_TARGET_ATTEMPTS} attempts with {s}.')
    canvas, snakes = targets
    for _ in range(s.num_distractor_snakes):
      for _ in range(s.max_distractor_retrial + 1):
        drawn = self._distractor(rng, g, canvas)
        if drawn is not None:
          canvas = drawn
          break
    first = rng.below(2)
    last = first if label else 1 - first
    markers = np.maximum(self._marker(*snakes[first].origin),
                         self._marker(*snakes[last].tip)) / 255.0
    image = np.zeros((s.resolution, s.resolution))
    for line, y, x in canvas.paddles:
      _place(image, line, y, x, g.half, np.maximum)
    marked = np.maximum(image, markers)
    # SciPy's old imsave: the image's range scaled to 0..255.
    low, high = marked.min(), marked.max()
    scaled = (marked - low) * (255.0 / ((high - low) or 1.0))
    return (scaled.clip(0, 255) + 0.5).astype(np.uint8), label, margin


def _permutation(rng: _Random, n: int) -> list[int]:
  """A uniform permutation of range(n) (Fisher-Yates)."""
  out = list(range(n))
  for i in range(n - 1, 0, -1):
    j = rng.below(i + 1)
    out[i], out[j] = out[j], out[i]
  return out


@functools.lru_cache(maxsize=8)
def _generator(s: Settings) -> _Generator:
  return _Generator(s)


def image_label(seed: int, resolution: int, difficulty: str, index: int
                ) -> int:
  """The label of an image without drawing it (its stream's first draw)."""
  return _Random(image_entropy(seed, resolution, difficulty, index)).below(2)


def generate_image(s: Settings, seed: int, difficulty: str, index: int
                   ) -> tuple[np.ndarray, int, int]:
  """Image `index` of the set (seed, resolution, difficulty).

  Returns:
    (uint8 `[R, R]` pixels, label 0/1, paddle margin).
  """
  rng = _Random(image_entropy(seed, s.resolution, difficulty, index))
  return _generator(s).image(rng)
