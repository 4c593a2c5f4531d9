"""``isinstance`` and ``issubclass`` against rloader's public classes answer as torch's classes
of the same name would.

rloader's classes subclass torch's, so rloader's objects pass checks written against torch's
names. The other way round needs this metaclass: code that switched its imports to rloader still
checks objects built on torch's classes (torchvision's datasets, a library's sampler) with
``isinstance(x, IterableDataset)`` and must get torch's answer. A class built on one of rloader's
(a user's dataset) checks as any other class does.
"""

from __future__ import annotations

import abc


class TorchTwin(abc.ABCMeta):
    """The metaclass of rloader's public classes. It derives from ``ABCMeta`` because torch's
    ``IterableDataset`` has that metaclass, and so that users may still mix ``abc.ABC`` into
    their datasets and samplers."""

    # The twin's check is by inheritance (its MRO), not through the twin's own metaclass: torch's
    # IterableDataset is an ABC, whose check asks its subclasses, this class among them.
    def __instancecheck__(cls, obj: object) -> bool:
        twin = cls.__dict__.get("_torch_twin")
        if twin is not None:
            return twin in type(obj).__mro__ or twin in getattr(obj.__class__, "__mro__", ())
        return super().__instancecheck__(obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        twin = cls.__dict__.get("_torch_twin")
        if twin is not None:
            if not isinstance(sub, type):
                raise TypeError("issubclass() arg 1 must be a class")
            return twin in sub.__mro__
        return super().__subclasscheck__(sub)


def pair(*pairs: tuple[type, type]) -> None:
    """Makes each rloader class of ``(rloader class, torch class)`` answer for the torch class."""
    for ours, theirs in pairs:
        assert issubclass(ours, theirs)
        ours._torch_twin = theirs  # type: ignore[attr-defined]
