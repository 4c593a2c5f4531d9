"""`ImageFolder` and `DatasetFolder`: torchvision's, whose samples are decoded and transformed
in Rust where that gives torchvision's result bit for bit."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from PIL import Image, features
from torchvision import datasets, get_image_backend
from torchvision.datasets.folder import default_loader, pil_loader

from rloader import _rloader
from rloader._collate import StackedSamples

from ._draws import draws_generator, draws_state, load_draws_state, worker_draws
from ._plan import Plan


class _Drawn(NamedTuple):
    """A sample of a batch drawn for Rust: its file, steps, output size, target, and the
    generator's state before its draws."""

    encoded: Any
    steps: list
    size: tuple
    target: Any
    state: torch.Tensor


class _RustSamples:
    """`__getitem__` through a plan of the transform, for torchvision's folder datasets.

    A sample takes the Rust path only where torchvision would open it with Pillow
    (`default_loader` or `pil_loader`, the PIL backend), its file is a JPEG or PNG decoded here
    exactly and under Pillow's decompression-bomb limit; otherwise, or where Rust's decoder
    fails, torchvision's own loader opens it (raising what torchvision raises for a bad file).
    On a thread worker, torch's random draws come from the worker's own generator
    (`_draws.py`).
    """

    draft: bool

    def _plan(self) -> Plan | None:
        # Read again whenever the transform, or a transform in its Compose's list, is replaced
        # (torchvision reads them every call), or torch's default float dtype (ToTensor's)
        # changes. A setting changed inside a transform that the plan read once (RandomCrop's
        # padding, Normalize's mean) needs `dataset.transform` assigned again.
        if torch._C._len_torch_function_stack() and torch.get_default_device().type != "cpu":
            return None  # (torch.set_default_device: torchvision's tensors are made there)
        transform = self.transform
        items = getattr(transform, "transforms", None)
        key = (
            tuple(map(id, items)) if isinstance(items, list) else None,
            torch.get_default_dtype(),
        )
        cached = self.__dict__.get("_rloader_plan")
        if cached is not None and cached[0] is transform and cached[1] == key:
            return cached[2]
        plan = None
        if transform is not None:
            plan = Plan(transform)
            if plan.empty:
                plan = None
        self.__dict__["_rloader_plan"] = (transform, key, plan)
        return plan

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        plan = self._plan() if self.loader in (default_loader, pil_loader) else None
        if plan is None or get_image_backend() != "PIL":
            with worker_draws():
                return super().__getitem__(index)
        encoded, _why = _rloader.vision_open(path)
        if not _decodes_exactly(encoded):
            with worker_draws():
                return super().__getitem__(index)
        generator = draws_generator()
        state = generator.get_state()
        sample = _run(plan, encoded, path, draft=self.draft, pool=self._pool())
        if sample is None:
            # Rust's decoder failed or warned (or the output is empty): torchvision makes the
            # sample, or raises, from the generator state it would have had.
            generator.set_state(state)
            with worker_draws():
                return super().__getitem__(index)
        if self.target_transform is not None:
            with worker_draws():
                target = self.target_transform(target)
        return sample, target

    def __getitems__(self, indices) -> list:
        """``[self[i] for i in indices]``, made in one call to Rust where the plan is the whole
        transform (nothing of torchvision's runs after it on a sample's pixels). In rloader's
        loops with the default collate, the samples are written straight into the batch's
        memory (a worker's shared-memory slot, the loader's recycled, perhaps pinned, batch
        memory), and collation takes them without a copy (`StackedSamples`)."""
        plan = self._whole_plan()
        if plan is None:
            return [self[i] for i in indices]
        indices = list(indices)
        try:
            items = [self.samples[index] for index in indices]
            opened = _rloader.vision_open_many([path for path, _ in items])
        except (IndexError, TypeError):  # raised one by one, after the samples before it
            return [self[i] for i in indices]
        generator = draws_generator()
        # Each sample's draws as __getitem__ makes them, in order: decoding draws nothing, so
        # Rust's samples are decoded after all the draws, and a sample __getitem__ would not
        # make in Rust is made by __getitem__, in its place. An error is raised once the
        # samples before it are made, as one by one (where Rust fails to decode one of those,
        # torchvision makes it, below).
        made: list = []
        error = None
        for index, (_, target), (encoded, _why) in zip(indices, items, opened):
            state = generator.get_state()
            try:
                drawn = self._draw(plan, encoded, target, state)
                if drawn is None:
                    generator.set_state(state)
                    drawn = self[index]
            except Exception as e:  # noqa: BLE001 - raised below, in its place
                error = e
                break
            made.append(drawn)
        rust = [k for k, m in enumerate(made) if type(m) is _Drawn]
        if not rust:
            if error is not None:
                raise error
            return made
        after = generator.get_state()  # the draws' end (where an error was raised, if one was)
        conversion = plan.conversion
        kind, dtype = conversion.kind, conversion.dtype
        width, height = made[rust[0]].size
        shape = (3, height, width)
        block = None
        if error is None and all(
            m.size == (width, height)
            if type(m) is _Drawn
            else type(m[0]) is kind and m[0].dtype == dtype and m[0].shape == shape
            for m in made
        ):
            block = _rloader.batch_empty([len(made), *shape], dtype)
        if block is not None:
            rows = block.unbind(0)
            outs = {k: rows[k] for k in rust}
        else:
            pool = self._pool()
            outs = {k: _empty_chw(conversion, *made[k].size, pool) for k in rust}
        pending, written_here = rust, set()
        while pending:
            written = _rloader.vision_run_many(
                [made[k].encoded for k in pending],
                [made[k].steps for k in pending],
                [(outs[k].data_ptr(), outs[k].nbytes) for k in pending],
                conversion.table,
                conversion.elem,
                3,
                draft=self.draft,
            )
            for k in pending[:written]:
                made[k] = (_as_kind(conversion, outs[k]), made[k].target)
                written_here.add(k)
            if written == len(pending):
                break
            # Rust's decoder failed or warned: torchvision makes that sample (or raises) from
            # the generator state it would have had; the samples after it were drawn already.
            at = pending[written]
            generator.set_state(made[at].state)
            made[at] = self._by_torchvision(indices[at], made[at].target)
            pending = pending[written + 1 :]
        generator.set_state(after)
        if error is not None:
            raise error
        if block is None:
            return made
        for k in sorted(set(range(len(made))) - written_here):  # made one by one: into its row
            sample, target = made[k]
            if type(sample) is not kind or sample.dtype != dtype or sample.shape != shape:
                return made  # (torchvision made a sample Rust could not, of another shape)
            rows[k].copy_(sample)
            made[k] = (_as_kind(conversion, rows[k]), target)
        return StackedSamples(made, block)

    def _by_torchvision(self, index: int, target):
        """Sample ``index`` as torchvision's ``__getitem__`` makes it, with ``target`` already
        through ``target_transform`` (which runs once per sample, as there)."""
        with worker_draws():
            sample = self.loader(self.samples[index][0])
            return self.transform(sample) if self.transform is not None else sample, target

    def _draw(self, plan: Plan, encoded, target, state) -> _Drawn | None:
        """A sample's draws and target for Rust to make it from `encoded`, or None where
        __getitem__ would not make it in Rust (its draws not kept)."""
        if not _decodes_exactly(encoded):
            return None
        recorded, done = plan.record(encoded.size)
        steps = encoded.steps(1, recorded)
        size = steps.size
        if done < len(plan.geometry) or 0 in size:
            return None
        if self.target_transform is not None:
            with worker_draws():
                target = self.target_transform(target)
        return _Drawn(encoded, steps, size, target, state)

    @property
    def _rloader_loads_without_gil(self) -> bool:
        """Whether a loader's batches are made by Rust, the GIL released but for the draws:
        `num_workers="auto"` then starts threads even though the loading holds its CPU."""
        return self._whole_plan() is not None

    def _whole_plan(self) -> Plan | None:
        """The plan where it is the whole transform and `__getitem__` is this class's, else
        None."""
        if type(self).__getitem__ is not _RustSamples.__getitem__:
            return None  # a subclass's own __getitem__ makes its samples
        if self.loader not in (default_loader, pil_loader) or get_image_backend() != "PIL":
            return None
        plan = self._plan()
        if plan is None or plan.conversion is None or plan.rest or plan.tail is not None:
            return None
        return plan

    def state_dict(self) -> dict:
        """Where this worker's random draws are (torchdata's convention for a map-style
        dataset): a DataLoader saves each worker's state after its last batch handed out, so a
        mid-epoch resume draws every augmentation as the uninterrupted run did. Empty in the
        main process, whose generators are the user's."""
        return draws_state()

    def load_state_dict(self, state: dict) -> None:
        load_draws_state(state)

    def _pool(self):
        pool = self.__dict__.get("_rloader_pool")
        if pool is None:
            pool = self.__dict__["_rloader_pool"] = _rloader.SamplePool(_POOL_BLOCKS)
        return pool

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_rloader_plan", None)
        state.pop("_rloader_pool", None)
        return state


# JPEGs decode as Pillow's only where Pillow decodes with libjpeg-turbo (its wheels do; a build
# against IJG's libjpeg upsamples chroma otherwise): elsewhere Pillow decodes them.
_PILLOW_DECODES_WITH_TURBO = bool(features.check_feature("libjpeg_turbo"))

# Free sample blocks a dataset keeps for the next samples: a batch's worth and more (a sample
# tensor lives until its batch is collated), ~80 MB of ImageNet-sized float32 samples.
_POOL_BLOCKS = 128


def _run(plan: Plan, encoded, path: str, *, draft: bool = False, pool=None):
    """One sample of the file at `path` through `plan`, or None where Rust's decoder failed or
    warned, the output is empty, or the sample would be a PIL image Rust cannot give the
    `.info` of. `draft`: a JPEG may decode at a reduced scale where the steps reduce it anyway
    (rloader-vision's NOTE [Draft]): close to torchvision's pixels, not equal."""
    # Only the transforms draw, from the thread worker's generator where on one (_draws.py).
    recorded, done = plan.record(encoded.size)
    conversion, rest = plan.conversion, plan.rest
    if done < len(plan.geometry):  # a fixed transform needs pixels: torchvision goes on from it
        rest = plan.geometry[done:] + (conversion.transforms if conversion else []) + rest
        conversion = None
    if conversion is None and encoded.format != "JPEG":
        return None  # (a PNG's .info may be in chunks after its pixels: Pillow reads them)
    steps = encoded.steps(1, recorded)
    width, height = steps.size
    if width == 0 or height == 0:
        return None
    if conversion is not None:
        out = _empty_chw(conversion, width, height, pool)
        ok = encoded.run(
            steps, out.data_ptr(), out.nbytes, conversion.table, conversion.elem, 3, draft=draft
        )
        sample = _as_kind(conversion, out)
    else:
        out = torch.empty((height, width, 3), dtype=torch.uint8)
        ok = encoded.run(steps, out.data_ptr(), out.nbytes, draft=draft)
        sample = Image.frombuffer("RGB", (width, height), out.numpy(), "raw", "RGB", 0, 1)
        sample.info = _pillow_info(path)
    if not ok:
        return None
    if rest:
        with worker_draws():
            for t in rest:
                sample = t(sample)
    if plan.tail is not None:
        sample = _convert(plan.tail, sample, pool)
    return sample


def _pillow_info(path: str) -> dict:
    """The `.info` of torchvision's image of the JPEG at `path` (EXIF, ICC profile, DPI, ...,
    which its transforms, or yours, may read): Pillow reads all of it from the header, and
    `convert("RGB")`, crops, resizes and flips copy it."""
    with Image.open(path) as img:
        return dict(img.info)


def _convert(tail, sample, pool):
    """`tail` (a Conversion) of `sample`: by Rust through its tables where the sample is an RGB
    PIL image (what they were computed from), else by torchvision's transforms."""
    if not (isinstance(sample, Image.Image) and sample.mode == "RGB"):
        with worker_draws():
            for t in tail.transforms:
                sample = t(sample)
        return sample
    width, height = sample.size
    out = _empty_chw(tail, width, height, pool)
    _rloader.vision_convert(
        sample.tobytes(), width, height, out.data_ptr(), out.nbytes, tail.table, tail.elem, 3
    )
    return _as_kind(tail, out)


def _decodes_exactly(encoded) -> bool:
    """Whether Rust makes this opened file's pixels as Pillow would: a JPEG or PNG it read
    (``encoded`` not None), under Pillow's decompression-bomb limit, and a JPEG only where
    Pillow decodes with libjpeg-turbo."""
    if encoded is None:
        return False
    limit = Image.MAX_IMAGE_PIXELS
    if limit and encoded.size[0] * encoded.size[1] > limit:
        return False
    return encoded.format != "JPEG" or _PILLOW_DECODES_WITH_TURBO


def _empty_chw(conversion, width: int, height: int, pool):
    """An uninitialised CHW tensor of `conversion`'s dtype: from `pool`'s recycled memory (no
    page faults for a fresh tensor each sample), or fresh without one."""
    shape = (3, height, width)
    if pool is None:
        return torch.empty(shape, dtype=conversion.dtype)
    return pool.empty(shape, conversion.dtype, 3 * height * width * conversion.elem)


def _as_kind(conversion, out):
    """`out` as the tensor type `conversion` makes (a plain tensor or a tv_tensors.Image)."""
    return out if conversion.kind is torch.Tensor else out.as_subclass(conversion.kind)


class DatasetFolder(_RustSamples, datasets.DatasetFolder):
    """torchvision's `DatasetFolder`, its samples decoded and transformed in Rust where the
    result is torchvision's bit for bit (see `ImageFolder`)."""

    def __init__(
        self,
        root,
        loader,
        extensions=None,
        transform=None,
        target_transform=None,
        is_valid_file=None,
        allow_empty=False,
        *,
        draft: bool = False,
    ):
        super().__init__(
            root, loader, extensions, transform, target_transform, is_valid_file, allow_empty
        )
        self.draft = draft


class ImageFolder(_RustSamples, datasets.ImageFolder):
    """torchvision's `ImageFolder` (same arguments, attributes and files found), whose JPEG
    and PNG samples are decoded and transformed in Rust with the GIL released.

    The transform is read once: its leading run of crops, resizes and flips (`Resize`,
    `CenterCrop`, `RandomResizedCrop`, `RandomCrop` without padding, the random flips), then
    the conversion to a tensor (`ToTensor`, `PILToTensor`, `ToImage`, then `ConvertImageDtype`,
    `ToDtype`, `Normalize`), v1 or v2, runs in Rust; random parameters are drawn by
    torchvision's own code from torch's generator, in its order. Every sample equals
    torchvision + Pillow's bit for bit, and torch's generator ends where it would. What
    follows the first other transform runs in torchvision, on the image it would have had.
    """

    def __init__(
        self,
        root,
        transform=None,
        target_transform=None,
        loader=default_loader,
        is_valid_file=None,
        allow_empty=False,
        *,
        draft: bool = False,
    ):
        super().__init__(root, transform, target_transform, loader, is_valid_file, allow_empty)
        self.draft = draft
