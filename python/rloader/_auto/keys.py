"""The epoch's keys under auto, drawn once and shared out: each engine draws through a share
of its own (a segment), and the next engine's share follows where the last one was closed."""

from __future__ import annotations

from .. import _rloader


class Source:
    """The epoch's keys, drawn once, in order, whichever engine draws them (``segment()``). An
    rloader ``BatchStream``'s shares are ``KeySegment``s, which the engines take in Rust (no
    Python list of keys per batch); any other sampler's are ``Segment``s."""

    def __init__(self, keys) -> None:
        self.stream = keys if isinstance(keys, _rloader.BatchStream) else None
        self.keys = iter(keys) if self.stream is None else None
        self._exhausted = False

    @property
    def exhausted(self) -> bool:
        return self.stream.exhausted if self.stream is not None else self._exhausted

    def segment(self):
        if self.stream is not None:
            return _rloader.KeySegment(self.stream)
        return Segment(self)

    def __next__(self):
        try:
            return next(self.keys)
        except StopIteration:
            self._exhausted = True
            raise


class Segment:
    """One engine's share of a Python sampler's keys: ends when the source does or when
    closed (``KeySegment``'s twin)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def __iter__(self) -> "Segment":
        return self

    def __next__(self):
        if self.closed:
            raise StopIteration
        return next(self.source)
