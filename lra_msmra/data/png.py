"""PNG files as LRA's Pathfinder pipeline reads and the generator writes them.

LRA decodes the Pathfinder PNGs with TensorFlow's `tf.io.decode_png`
(libpng). `decode` gives the same pixels and refuses the same files without
TensorFlow: the file's chunks and zlib stream are checked here as libpng
checks them, and Pillow undoes the row filters of a plain copy of the
scanlines (tests/data/test_pathfinder.py compares both on release-style,
generated and damaged files). `write` writes the generator's images.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import NamedTuple, Optional

import numpy as np

from lra_msmra import errors

# The 8-byte signature every PNG file starts with.
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
# PNG colour type -> (bit depths it allows, channels TensorFlow's
# `decode_png(channels=0)` returns: a palette expands to RGB, or to RGBA
# with a tRNS chunk). Only grayscale (one channel) is decoded here.
_COLOUR_TYPES = {0: ((1, 2, 4, 8, 16), 1),  # grayscale
                 2: ((8, 16), 3),  # RGB
                 3: ((1, 2, 4, 8), 3),  # palette
                 4: ((8, 16), 2),  # grayscale + alpha
                 6: ((8, 16), 4)}  # RGBA
# libpng's default limit on each image dimension.
_MAX_DIMENSION = 1_000_000
_CRITICAL = (b'IHDR', b'PLTE', b'IDAT', b'IEND')
# Image data libpng gives zlib at a time (PNG_IDAT_READ_SIZE).
_IDAT_READ_SIZE = 8192
# The ancillary chunks TF's libpng knows: before IHDR they are an error,
# where chunks it does not know are skipped.
_KNOWN_ANCILLARY = frozenset((
    b'bKGD', b'cHRM', b'eXIf', b'gAMA', b'hIST', b'iCCP', b'iTXt', b'oFFs',
    b'pCAL', b'pHYs', b'sBIT', b'sCAL', b'sPLT', b'sRGB', b'tEXt', b'tIME',
    b'tRNS', b'zTXt'))


class _Png(NamedTuple):
  """A PNG as `_read` found it: the shape TF returns, the bit depth,
  and a plain file of the same pixels for Pillow (None when the shape is
  not the one asked for: no need to decode)."""
  shape: tuple[int, int, int]
  bit_depth: int
  stream: Optional[bytes]


def _chunk(kind: bytes, body: bytes) -> bytes:
  """One PNG chunk: length, type, data, CRC."""
  return (struct.pack('>I', len(body)) + kind + body +
          struct.pack('>I', zlib.crc32(body, zlib.crc32(kind))))


def _raw_size(width: int, height: int, bits_per_pixel: int,
              interlaced: bool) -> int:
  """Bytes of the filtered scanlines (a filter byte per row)."""
  if not interlaced:
    return height * (1 + (width * bits_per_pixel + 7) // 8)
  size = 0
  # Adam7: (first row, row step, first column, column step) of each pass.
  for y0, dy, x0, dx in ((0, 8, 0, 8), (0, 8, 4, 8), (4, 8, 0, 4),
                         (0, 4, 2, 4), (2, 4, 0, 2), (0, 2, 1, 2),
                         (1, 2, 0, 1)):
    cols, rows = -(-(width - x0) // dx), -(-(height - y0) // dy)
    if cols > 0 and rows > 0:
      size += rows * (1 + (cols * bits_per_pixel + 7) // 8)
  return size


def _inflate(idat: list[memoryview], need: int) -> bytes:
  """The first `need` bytes of the image data, read as libpng reads them.

  libpng gives zlib the IDAT chunks (of the first run; zero-length ones
  skipped) in pieces of `_IDAT_READ_SIZE` bytes until the image is
  complete, and fails if a piece is needed and the run has ended. Then it
  reads on to the end of the zlib stream: one more piece if the stream
  holds nothing beyond the image, as many as it needs otherwise, and there
  a zlib error (a wrong checksum) is only a warning.

  Raises:
    ValueError: what libpng would fail on.
  """
  pieces = (part[i:i + _IDAT_READ_SIZE] for part in idat
            for i in range(0, len(part), _IDAT_READ_SIZE))
  inflate = zlib.decompressobj(wbits=0)  # The window of the zlib header.
  out, got, tail = [], 0, b''
  try:
    while got < need:
      if not tail:
        tail = next(pieces, None)
        if tail is None:
          raise ValueError('not enough image data')
      out.append(inflate.decompress(tail, need - got))
      got += len(out[-1])
      tail = inflate.unconsumed_tail
      if inflate.eof and got < need:
        raise ValueError('not enough image data')
  except zlib.error as e:
    raise ValueError(f'bad image data ({e})') from None
  extra = 0  # Bytes beyond the image: while there are any, read on.
  while not inflate.eof:
    if not tail:
      tail = next(pieces, None)
      if tail is None:
        raise ValueError('not enough image data (its zlib stream is cut '
                         'short)')
    try:
      extra += len(inflate.decompress(tail, 1024))
    except zlib.error:
      break
    tail = inflate.unconsumed_tail
    if not extra:
      break
  return b''.join(out)


def _read(data: bytes, resolution: int) -> _Png:
  """Reads a PNG's structure and, if it is R x R x 1, its image data, as
  libpng does.

  libpng is TensorFlow's PNG decoder. Pillow decodes what libpng refuses: a
  file cut after its image data, critical chunks whose CRC is wrong, too
  little image data (the missing rows come back black), unknown critical
  chunks; it refuses some files libpng reads (an ancillary chunk with a
  wrong CRC, which libpng skips). So the chunks and the zlib stream are
  checked here, libpng's way, and Pillow gets a plain file of the same
  scanlines to undo the row filters. A file of another shape is refused
  without decoding its pixels.

  Raises:
    ValueError: why libpng would refuse the file.
  """
  if not data.startswith(PNG_SIGNATURE):
    raise ValueError('not a PNG file')
  view = memoryview(data)
  pos, header, plte, idat = len(PNG_SIGNATURE), None, None, []
  trns = idat_done = False
  while True:
    if pos + 8 > len(data):
      raise ValueError('truncated (no IEND chunk)')
    length, kind = struct.unpack_from('>I4s', data, pos)
    end = pos + 12 + length
    if length > 0x7FFFFFFF or not kind.isalpha():
      raise ValueError(f'bad chunk at byte {pos}')
    if end > len(data):
      raise ValueError(f'truncated (chunk {kind.decode()} at byte {pos})')
    body = view[pos + 8:end - 4]
    crc_ok = (zlib.crc32(body, zlib.crc32(kind)) ==
              struct.unpack_from('>I', data, end - 4)[0])
    critical = kind[0] < 0x60  # An upper-case first letter.
    if critical and not crc_ok:
      raise ValueError(f'CRC error in chunk {kind.decode()}')
    if critical and kind not in _CRITICAL:
      raise ValueError(f'unknown critical chunk {kind.decode()}')
    if header is None and kind != b'IHDR':
      if critical or kind in _KNOWN_ANCILLARY:
        raise ValueError('IHDR is not the first chunk')
    elif kind == b'IHDR':
      if header is not None:
        raise ValueError('second IHDR chunk')
      if length != 13:
        raise ValueError('bad IHDR chunk')
      header = struct.unpack('>IIBBBBB', body)
      width, height, depth, colour, compression, filtering, interlace = (
          header)
      if (not (0 < width <= _MAX_DIMENSION and 0 < height <= _MAX_DIMENSION)
          or colour not in _COLOUR_TYPES
          or depth not in _COLOUR_TYPES[colour][0]
          or compression or filtering or interlace > 1):
        raise ValueError(f'bad IHDR (size {width}x{height}, bit depth '
                         f'{depth}, colour type {colour}, compression '
                         f'{compression}, filter {filtering}, interlace '
                         f'{interlace})')
    elif kind == b'PLTE':
      # Never twice. Optional (and ignored) in other colour types, where
      # libpng forgives a bad length, but not an empty one in colour.
      if plte is not None:
        raise ValueError('second PLTE chunk')
      plte = bytes(body)
      if colour == 3 and (not length or length % 3 or length > 768):
        raise ValueError('bad PLTE chunk')
      if colour in (2, 6) and not length and not idat:
        raise ValueError('empty PLTE chunk')
    elif kind == b'tRNS':
      trns = trns or (crc_ok and not idat)
    elif kind == b'IDAT':
      if colour == 3 and plte is None:
        raise ValueError('palette image without a PLTE chunk before IDAT')
      if not idat_done:  # IDAT chunks after another chunk are ignored.
        idat.append(body)
    elif kind == b'IEND':
      if not idat:
        raise ValueError('no image data (IDAT) before IEND')
      break
    idat_done = idat_done or (bool(idat) and kind != b'IDAT')
    pos = end
  shape = (height, width, _COLOUR_TYPES[colour][1] + (colour == 3 and trns))
  if shape != (resolution, resolution, 1):
    return _Png(shape, depth, None)  # Refused either way.
  raw = _inflate(idat, _raw_size(width, height, depth, interlace == 1))
  # The same scanlines in one stored (uncompressed) zlib stream.
  stream = (PNG_SIGNATURE + _chunk(b'IHDR', struct.pack('>IIBBBBB', *header))
            + _chunk(b'IDAT', zlib.compress(raw, 0)) + _chunk(b'IEND', b''))
  return _Png(shape, depth, stream)


def decode(data: bytes, resolution: int) -> np.ndarray:
  """Decodes one single-channel R x R PNG to uint8 `[R * R]`.

  Pillow decodes the pixels; the result is what TensorFlow's
  `tf.io.decode_png(data, channels=0)` (LRA's decoder) gives, and the same
  files are refused (tests/data/test_pathfinder.py compares both):
  grayscale of any bit depth is accepted (1, 2 and 4 bits scaled to 0..255
  as libpng expands them; 16 bits reduced to the high byte, as TF does with
  uint8 output; a tRNS chunk is ignored); grayscale + alpha, RGB, RGBA and
  palette images have 2, 3, 4 and 3 (or, with tRNS, 4) channels and are
  refused. One difference: TF's `decode_png` also decodes JPEG, GIF and
  WebP data; such files are refused here as not PNGs.

  Raises:
    ValueError: not a decodable PNG or the wrong shape, on one line.
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  try:
    found = _read(data, resolution)
    if found.stream is not None:
      with Image.open(io.BytesIO(found.stream), formats=('PNG',)) as image:
        image.load()
        pixels = np.asarray(image)
  except (ValueError, OSError, SyntaxError, EOFError) as e:
    raise ValueError(f'cannot decode the PNG ({errors.one_line(e)}).'
                     ) from None
  if found.stream is None:
    raise ValueError(f'expected a {resolution}x{resolution} single-channel '
                     f'image, got shape {found.shape}.')
  if found.bit_depth == 16:
    pixels = pixels.astype(np.uint16) >> 8
  elif found.bit_depth == 1:
    pixels = pixels.astype(bool) * 255
  return pixels.astype(np.uint8).reshape(-1)


def write(path: str, image: np.ndarray) -> None:
  """Writes uint8 `[H, W]` as an 8-bit grayscale PNG (no filtering)."""
  if image.dtype != np.uint8 or image.ndim != 2:
    raise ValueError(f'Expected uint8 [H, W], got {image.dtype} '
                     f'{image.shape}.')
  h, w = image.shape
  # Each row starts with filter type 0 (none).
  raw = b''.join(b'\x00' + image[r].tobytes() for r in range(h))
  header = struct.pack('>IIBBBBB', w, h, 8, 0, 0, 0, 0)  # 8-bit gray.
  with open(path, 'wb') as f:
    f.write(PNG_SIGNATURE + _chunk(b'IHDR', header) +
            _chunk(b'IDAT', zlib.compress(raw)) + _chunk(b'IEND', b''))
