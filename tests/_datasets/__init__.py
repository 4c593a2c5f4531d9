"""Datasets (and worker_init_fns) that several test files, and the scripts they run in child
processes, load: defined once, importable by name from a worker process under any start
method. By concern: samples.py (map-style datasets by what they make), streams.py
(IterableDatasets), workers.py (what a worker is and does), timing.py (samples that take time
or wait)."""

from .samples import *  # noqa: F403
from .streams import *  # noqa: F403
from .timing import *  # noqa: F403
from .workers import *  # noqa: F403
from .workers import _MAIN_PID, _rebuild_only_in_a_worker  # noqa: F401
