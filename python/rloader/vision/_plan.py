"""A transform pipeline read once: the part that runs in Rust, and the rest.

A plan is the pipeline's leading run of supported transforms, split into two stages:

- geometry: crops, resizes and flips of the PIL image. Per sample they run as torchvision
  runs them, on a `_Recorder` (a `PIL.Image.Image` that holds only a size): the transform's
  own `forward` draws its random parameters from torch's generator in its own order and calls
  the recorder's `crop`, `resize` and `transpose`, which write the call down instead of
  touching pixels. Rust then makes exactly those calls' pixels, as Pillow would.
- conversion: `ToTensor`/`PILToTensor`/`ToImage`, then any of `ConvertImageDtype`, `ToDtype`
  and `Normalize`. Each maps a channel's byte to a value on its own, so the stage is computed
  once, by torchvision itself, over the 256 bytes of each channel (`Conversion.table`).

What follows the first other transform runs in torchvision, on the image (or tensor) it would
have had.
"""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np
import PIL
import torch
from PIL import Image
from torchvision import transforms as v1

from rloader import _rloader

from ._draws import WorkerDraws, draws_generator, worker_draws

try:  # torchvision >= 0.16
    from torchvision.transforms import v2
except ImportError:  # pragma: no cover - the oldest torchvision rloader runs with has v2
    v2 = None

# Pillow's resampling filters, by the names Rust takes.
_FILTERS = {
    Image.Resampling.NEAREST: "nearest",
    Image.Resampling.BOX: "box",
    Image.Resampling.BILINEAR: "bilinear",
    Image.Resampling.HAMMING: "hamming",
    Image.Resampling.BICUBIC: "bicubic",
    Image.Resampling.LANCZOS: "lanczos",
}


def _pillow_version() -> tuple[int, int]:
    major, minor = (int(x) for x in PIL.__version__.split(".")[:2])
    return major, minor


# Pillow 13 runs a resize's vertical pass first where the height shrinks much more than the
# width; before 12.2 the horizontal pass always runs first; Pillow 12.2 splits very tall
# resizes in two in Python. Rust reproduces the first two (`vision_pillow_13_passes`); under
# Pillow 12.2 resizes stay in Pillow, so the samples stay exact.
RESIZES_EXACT = not ((12, 2) <= _pillow_version() < (13, 0))
_rloader.vision_pillow_13_passes(_pillow_version() >= (13, 0))


class Unrecordable(Exception):
    """A transform asked the recorder for something only real pixels can give."""


class _Recorder(Image.Image):
    """A PIL image with a size and no pixels: it writes down the crops, resizes and flips made
    on it (`steps`), with Pillow's own argument checks, and answers size queries."""

    def __init__(self, size: tuple[int, int], steps: list):
        super().__init__()
        self._mode = "RGB"
        self._size = size
        self.steps = steps

    def _then(self, size, step) -> _Recorder:
        self.steps.append(step)
        return _Recorder(size, self.steps)

    def crop(self, box=None):
        if box is None:
            return _Recorder(self._size, self.steps)
        # Image.crop's checks and _crop's rounding.
        if box[2] < box[0]:
            raise ValueError("Coordinate 'right' is less than 'left'")
        if box[3] < box[1]:
            raise ValueError("Coordinate 'lower' is less than 'upper'")
        x0, y0, x1, y1 = (int(round(n)) for n in box)
        Image._decompression_bomb_check((abs(x1 - x0), abs(y1 - y0)))
        return self._then((x1 - x0, y1 - y0), ("crop", x0, y0, x1, y1))

    def resize(self, size, resample=None, box=None, reducing_gap=None):
        if resample is None:
            resample = Image.Resampling.BICUBIC
        if resample not in _FILTERS or reducing_gap is not None:
            raise Unrecordable(f"resize(resample={resample!r}, reducing_gap={reducing_gap!r})")
        if not all(isinstance(s, int) for s in size):  # as Pillow's C resize refuses them
            raise TypeError("'float' object cannot be interpreted as an integer")
        size = tuple(size)
        if box is None:
            box = (0, 0) + self._size
        if self._size == size and tuple(box) == (0, 0) + self._size:
            return _Recorder(self._size, self.steps)  # Image.resize's copy
        w, h = self._size
        x0, y0, x1, y1 = (float(b) for b in box)
        # _imaging.c's checks, in its order and words.
        if size[0] < 1 or size[1] < 1:
            raise ValueError("height and width must be > 0")
        if x0 < 0 or y0 < 0:
            raise ValueError("box offset can't be negative")
        if x1 > w or y1 > h:
            raise ValueError("box can't exceed original image size")
        if x1 - x0 < 0 or y1 - y0 < 0:
            raise ValueError("box can't be empty")
        return self._then(size, ("resize", size[0], size[1], _FILTERS[resample], x0, y0, x1, y1))

    def transpose(self, method):
        if method == Image.Transpose.FLIP_LEFT_RIGHT:
            return self._then(self._size, ("flip_lr",))
        if method == Image.Transpose.FLIP_TOP_BOTTOM:
            return self._then(self._size, ("flip_tb",))
        raise Unrecordable(f"transpose({method!r})")

    def load(self):
        raise Unrecordable("pixels")

    def copy(self):
        return _Recorder(self._size, self.steps)


def _classes(*names: str, where=(v1, v2)) -> tuple[type, ...]:
    return tuple(getattr(m, n) for m in where if m is not None for n in names if hasattr(m, n))


_RANDOM_GEOMETRY = _classes(
    "RandomResizedCrop", "RandomCrop", "RandomHorizontalFlip", "RandomVerticalFlip"
)
_FIXED_GEOMETRY = _classes("Resize", "CenterCrop")
_TO_TENSOR = _classes("ToTensor", "PILToTensor", "ToImage")
_ELEMENTWISE = _classes("ConvertImageDtype", "ToDtype", "Normalize")


def _geometry(t) -> bool:
    """Whether `t` is a transform whose PIL calls are crops, resizes and flips only."""
    if type(t) not in _RANDOM_GEOMETRY + _FIXED_GEOMETRY:
        return False
    if not RESIZES_EXACT and type(t).__name__ in ("Resize", "RandomResizedCrop"):
        return False
    if type(t).__name__ == "RandomCrop":  # padding needs pixels
        return t.padding is None and not t.pad_if_needed
    return True


def _crop_size(size) -> tuple[int, int]:
    # (height, width) of CenterCrop's size, as torchvision's center_crop reads it.
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    return (size[0], size[1]) if len(size) == 2 else (size[0], size[0])


def _needs_pixels(t, size: tuple[int, int]) -> bool:
    """Whether the fixed transform `t` would pad an image of `size` (only CenterCrop can)."""
    if type(t).__name__ != "CenterCrop":
        return False
    crop_h, crop_w = _crop_size(t.size)
    return crop_w > size[0] or crop_h > size[1]


def _hooked(t) -> bool:
    # Module hooks run only through the module's __call__.
    m = torch.nn.modules.module
    return bool(
        t._forward_hooks
        or t._forward_pre_hooks
        or m._global_forward_hooks
        or m._global_forward_pre_hooks
    )


class Conversion:
    """The PIL-to-tensor stage: its transforms, and the tensor each channel's 256 bytes
    become through them (computed once, by torchvision)."""

    def __init__(self, transforms: list):
        self.transforms = transforms
        ramp = np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], 3, axis=2)  # 1x256 RGB
        probe = Image.fromarray(ramp)  # HxWx3 uint8: RGB
        for t in transforms:
            probe = t(probe)
        if not (isinstance(probe, torch.Tensor) and probe.shape == (3, 1, 256)):
            raise Unrecordable(f"conversion gives {type(probe).__name__}")
        self.dtype = probe.dtype
        self.kind = type(probe)  # torch.Tensor, or tv_tensors.Image after ToImage
        values = probe.as_subclass(torch.Tensor).contiguous()
        self.elem = values.element_size()
        self.table = values.view(torch.uint8).numpy().tobytes()


class Plan:
    """`transform` read once: `geometry` (transforms recorded per sample), `conversion` (or
    None: the plan's result is a PIL image), `rest` (run by torchvision after) and `tail` (or
    None): where `rest` ends with a conversion to a tensor, that conversion, which Rust makes
    of the RGB image the rest of `rest` gives (``ColorJitter`` or ``TrivialAugmentWide``
    before ``ToTensor`` and ``Normalize``), through the same tables."""

    def __init__(self, transform):
        # Exactly torchvision's Compose: a subclass may call its transforms otherwise.
        if type(transform) in _classes("Compose"):
            steps = list(transform.transforms)
        else:
            steps = [transform]
        n = 0
        while n < len(steps) and _geometry(steps[n]):
            n += 1
        self.geometry = steps[:n]
        m = n
        if m < len(steps) and type(steps[m]) in _TO_TENSOR:
            m += 1
            while m < len(steps) and type(steps[m]) in _ELEMENTWISE:
                m += 1
        self.conversion = None
        if m > n:
            try:
                self.conversion = Conversion(steps[n:m])
            except Unrecordable:
                m = n
        self.rest = steps[m:]
        # Whether the geometry's draws may name the generator (`_draws_agree`): found at the
        # first sample (None until then).
        self._explicit = None
        self.tail = None
        k = len(self.rest)
        while k > 0 and type(self.rest[k - 1]) in _ELEMENTWISE:
            k -= 1
        if k > 1 and type(self.rest[k - 1]) in _TO_TENSOR:
            try:
                self.tail = Conversion(self.rest[k - 1 :])
                self.rest = self.rest[: k - 1]
            except Unrecordable:
                pass

    @property
    def empty(self) -> bool:
        return not self.geometry and self.conversion is None and self.tail is None

    def record(self, size: tuple[int, int]):
        """Runs the geometry on a recorder of `size` (drawing its random parameters as
        torchvision does, from the calling worker's generator: `_draws.py`): `(steps, done)`,
        `done` being how many transforms were recorded (fewer than all where a fixed transform
        would need pixels: those run in torchvision)."""
        if not any(map(_hooked, self.geometry)):  # (hooks run only through __call__)
            if self._explicit is None:
                self._explicit = _draws_agree(self.geometry)
            if self._explicit:
                return self._record(size, draws_generator())
        with worker_draws():
            return self._record(size, None)

    def _record(self, size: tuple[int, int], generator):
        steps: list = []
        img = _Recorder(size, steps)
        for i, t in enumerate(self.geometry):
            if _needs_pixels(t, img.size):
                return steps, i
            fast = _FORWARD.get(type(t))
            if fast is None or (generator is None and _hooked(t)):  # (`record` looked for hooks)
                img = t(img)
            else:
                img = fast(t, img, generator)
        return steps, len(self.geometry)


# torchvision v1's `forward` of the supported transforms, for a PIL image, written out: the
# same calls (its own `get_params`, so the same draws in the same order), without the
# dispatch torchvision goes through for any input type, which cost as much as the draws.
# tests/test_vision.py compares each with torchvision's own; v2's go through `forward`.
#
# Given a `generator`, the random ones (v1's and v2's) draw from it by name, with
# torchvision's arithmetic (`get_params`, `make_params`) written again: on a thread worker
# that spares every torch call of the draws the dispatch of `WorkerDraws`, most of the GIL a
# sample holds. A plan uses them only where `_draws_agree` found them equal to torchvision's
# own, draws and generator state, in this process; otherwise (generator None) torchvision's
# own code draws, under `WorkerDraws`. tests/test_vision_draws.py compares them over many
# sizes.


def _resize_v1(img: _Recorder, size, interpolation, max_size=None, antialias=True) -> _Recorder:
    # torchvision.transforms.functional.resize, for a PIL image.
    if (
        not isinstance(interpolation, v1.InterpolationMode)
        or antialias is False
        or max_size is not None
    ):  # torchvision's own checks and warnings
        return v1.functional.resize(img, size, interpolation, max_size, antialias)
    if isinstance(size, int):
        size = [size]
    width, height = img.size
    output = _compute_resized_output_size((height, width), list(size), max_size)
    if [height, width] == output:
        return img
    return img.resize(tuple(output[::-1]), _PIL_MODES[interpolation])


def _log_ratio(ratio) -> tuple[float, float]:
    # get_params's torch.log(torch.tensor(ratio)), as uniform_ reads it: its dtype is the
    # default one, or the ratio's own (numpy's float64s), hence the types in the key.
    return _log_ratio_of(tuple((type(r), r) for r in ratio), torch.get_default_dtype())


@functools.lru_cache(maxsize=64)
def _log_ratio_of(typed: tuple, dtype: torch.dtype) -> tuple[float, float]:
    log_ratio = torch.log(torch.tensor([r for _, r in typed]))
    return log_ratio[0].item(), log_ratio[1].item()


def _resized_crop_params(size, scale, ratio, log_ratio, generator) -> tuple[int, int, int, int]:
    """RandomResizedCrop's draws (v1's get_params, v2's make_params) for an image of `size`,
    from `generator`: (top, left, height, width)."""
    width, height = size
    area = height * width
    low, high = log_ratio
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(low, high, generator=generator)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,), generator=generator).item()
            j = torch.randint(0, width - w + 1, size=(1,), generator=generator).item()
            return i, j, h, w
    in_ratio = float(width) / float(height)  # the central crop
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _random_resized_crop_v1(t, img: _Recorder, generator=None) -> _Recorder:
    if generator is None:
        i, j, h, w = t.get_params(img, t.scale, t.ratio)
    else:
        log_ratio = _log_ratio(t.ratio)
        i, j, h, w = _resized_crop_params(img.size, t.scale, t.ratio, log_ratio, generator)
    img = img.crop((j, i, j + w, i + h))
    return _resize_v1(img, t.size, t.interpolation, None, t.antialias)


def _random_crop_v1(t, img: _Recorder, generator=None) -> _Recorder:
    # padding None, pad_if_needed False
    width, height = img.size
    th, tw = t.size
    if generator is None or height < th or width < tw:  # (get_params raises for the latter)
        i, j, h, w = t.get_params(img, t.size)
    elif (width, height) == (tw, th):
        i, j, h, w = 0, 0, height, width
    else:
        i = torch.randint(0, height - th + 1, size=(1,), generator=generator).item()
        j = torch.randint(0, width - tw + 1, size=(1,), generator=generator).item()
        h, w = th, tw
    return img.crop((j, i, j + w, i + h))


def _center_crop_v1(t, img: _Recorder, generator=None) -> _Recorder:
    # only where no padding is needed
    crop_height, crop_width = _crop_size(t.size)
    width, height = img.size
    top = int(round((height - crop_height) / 2.0))
    left = int(round((width - crop_width) / 2.0))
    return img.crop((left, top, left + crop_width, top + crop_height))


def _horizontal_flip_v1(t, img: _Recorder, generator=None) -> _Recorder:
    if torch.rand(1, generator=generator) < t.p:
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return img


def _vertical_flip_v1(t, img: _Recorder, generator=None) -> _Recorder:
    if torch.rand(1, generator=generator) < t.p:
        return img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    return img


def _resize_transform_v1(t, img: _Recorder, generator=None) -> _Recorder:
    return _resize_v1(img, t.size, t.interpolation, t.max_size, t.antialias)


# v2's: the draws of its `make_params` (or its random apply) naming the generator, then its own
# `transform` with those parameters; without a generator, its `forward`.


def _random_resized_crop_v2(t, img: _Recorder, generator=None) -> _Recorder:
    if generator is None:
        return t(img)
    log_ratio = t._log_ratio.tolist()  # (made by its __init__, in the dtype of then)
    i, j, h, w = _resized_crop_params(img.size, t.scale, t.ratio, log_ratio, generator)
    return t.transform(img, dict(top=i, left=j, height=h, width=w))


def _random_flip_v2(t, img: _Recorder, generator=None) -> _Recorder:
    if generator is None:
        return t(img)
    if torch.rand(1, generator=generator) >= t.p:
        return img
    return t.transform(img, {})


def _fixed_v2(t, img: _Recorder, generator=None) -> _Recorder:
    return t(img)  # (draws nothing)


try:  # where torchvision keeps them (private: the generic path serves without them)
    from torchvision.transforms.functional import _compute_resized_output_size, pil_modes_mapping

    _PIL_MODES = pil_modes_mapping
    _V1_FORWARD = {
        v1.RandomResizedCrop: _random_resized_crop_v1,
        v1.RandomCrop: _random_crop_v1,
        v1.CenterCrop: _center_crop_v1,
        v1.RandomHorizontalFlip: _horizontal_flip_v1,
        v1.RandomVerticalFlip: _vertical_flip_v1,
        v1.Resize: _resize_transform_v1,
    }
except ImportError:  # pragma: no cover - torchvision moved them
    _V1_FORWARD = {}

# The transforms whose draws may name a generator: v1's written out, and v2's where their
# `transform` takes parameters as in the torchvision versions rloader is tested with.
_FORWARD = dict(_V1_FORWARD)
if v2 is not None and all(
    hasattr(c, "transform")
    for c in (v2.RandomResizedCrop, v2.RandomHorizontalFlip, v2.RandomVerticalFlip)
):
    _FORWARD.update(
        {
            v2.RandomResizedCrop: _random_resized_crop_v2,
            v2.RandomHorizontalFlip: _random_flip_v2,
            v2.RandomVerticalFlip: _random_flip_v2,
            v2.Resize: _fixed_v2,
            v2.CenterCrop: _fixed_v2,
        }
    )

# Image sizes `_draws_agree` draws for: square, wide, tall, tiny (RandomResizedCrop's central
# crop after ten misses), crop-sized and photo-sized.
_CHECK_SIZES = [
    (1, 1),
    (2, 3),
    (3, 700),
    (700, 3),
    (224, 224),
    (225, 223),
    (500, 375),
    (375, 500),
    (1200, 800),
    (4000, 3000),
]


def _draws_agree(geometry: list) -> bool:
    """Whether each transform's draws naming a generator give torchvision's own: the same steps
    (or exception type) and the same generator state after, four draws at each of
    `_CHECK_SIZES`, from one seed. False for a transform with no such draws."""
    mine, theirs = torch.Generator(), torch.Generator()
    for t in geometry:
        fast = _FORWARD.get(type(t))
        if fast is None:
            return False
        mine.manual_seed(0x5EED)
        theirs.manual_seed(0x5EED)
        for size in _CHECK_SIZES * 4:
            if _needs_pixels(t, size):
                continue
            a = _outcome(functools.partial(_by_name, fast, t, mine), size)
            with WorkerDraws(theirs):
                b = _outcome(t.forward, size)  # torchvision's own (forward: no hooks)
            if a != b or not torch.equal(mine.get_state(), theirs.get_state()):
                return False
    return True


def _by_name(fast, t, generator, img):
    return fast(t, img, generator)


def _outcome(transform, size):
    steps: list = []
    try:
        transform(_Recorder(size, steps))
    except Exception as e:  # noqa: BLE001 - compared: the same type both ways
        return type(e)
    return steps
