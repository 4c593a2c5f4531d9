"""Read-only containers whose data lives once in shared memory per node.

A Python list or dict that a ``Dataset`` holds is copied, page by page, into every worker
process that reads it (reading an object writes its reference count), and every rank that
``torchrun`` starts builds its own. The containers here keep their data in one sealed,
anonymous shared-memory file (a memfd) per node instead: reads write nothing to it, worker
processes attach to it when they unpickle the dataset (a container pickles as a small
handle), and ranks that were not forked from one another find it by a key.

- ``SharedList``: a list of ``str`` or ``bytes`` (file paths, captions);
- ``SharedArray``: a numeric array (labels, offsets), with a zero-copy numpy view;
- ``SharedDict``: a mapping of ``str`` to ``int`` (class names).

Each is built from a Python object (``SharedList(paths)``); with ``key=``, processes holding
the same items share one copy (``SharedList(paths, key="train-paths")``), and
``SharedList.attach(key, version=..., build=...)`` finds the copy another process serves
under a key and version, building it only where none is served yet. Nothing is left in
/dev/shm or anywhere else when the processes end, however they end. See docs/shared.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._rloader import SharedArray, SharedDict, SharedList

Sequence.register(SharedList)
Mapping.register(SharedDict)

__all__ = ["SharedArray", "SharedDict", "SharedList"]
