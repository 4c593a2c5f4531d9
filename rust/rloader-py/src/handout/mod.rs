//! Handing batches out to the user: what both multi-worker iterators (`PoolIter` in
//! process/pool/, `ThreadIter` in threads/iter.rs) do the same way, written once.
//!
//! - [`Answer`]: what a worker (process or thread) answered to one task;
//! - [`HandOutState`]: what an iterator has handed out this epoch (the count and end that
//!   `DataLoader.state_dict()` reads, the per-task record `HandOuts`), its length, torch's
//!   length warning and its `Stats`;
//! - [`iterator_methods!`]: the Python methods both iterators share (`__iter__`, `__next__`'s
//!   timing, `__len__`, `__reduce__`, `_progress`, `_stats`, `_handouts`), over that state;
//! - `options.rs`: `HandOutOptions`, what both iterators are built with (order, timeout,
//!   length, persistence);
//! - `handouts.rs`: `HandOuts`, the per-task record (NOTE [Resume]);
//! - `length_warning.rs`: `LengthWarning`, torch's warning past an IterableDataset's length
//!   (the single-process loop's too).

mod answer;
pub mod handouts;
pub mod length_warning;
mod options;

pub use answer::{reraise, Answer, WorkerState};
pub use handouts::HandOuts;
pub use length_warning::LengthWarning;
pub use options::{set_prefetch_factor, HandOutOptions};

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use rloader_workers::{Next, Scheduler};

use crate::errors::no_length;
use crate::stats::Stats;

/// The dataset states of an epoch's results that were never handed out (the epoch was left
/// early, `break`), per worker, the latest of each: drained as persistent workers start the
/// next epoch, they say where each worker's dataset is then (NOTE [Resume]). A worker's
/// results come in the order it made them: those the pin thread held first, then those still
/// owed.
pub struct Drained(Vec<Option<Py<PyAny>>>);

impl Drained {
    pub fn new(num_workers: usize) -> Self {
        Drained((0..num_workers).map(|_| None).collect())
    }

    /// `worker`'s result came with `state` (None: not said).
    pub fn note(&mut self, worker: usize, state: Option<WorkerState>) {
        if let (Some(slot), Some((state, _))) = (self.0.get_mut(worker), state) {
            *slot = Some(state);
        }
    }

    /// Takes every result `scheduler` holds ready (the epoch's keys exhausted), noting each
    /// one's state: true once no answer is owed any more, false while a worker owes one (wait
    /// for it, then call again).
    pub fn take_ready(&mut self, scheduler: &mut Scheduler<Answer>) -> bool {
        loop {
            match scheduler.next() {
                Next::Ready(mut answer) => {
                    if let Some((worker, _)) = scheduler.last_handed_out() {
                        self.note(worker, answer.take_state());
                    }
                }
                Next::Done => return true,
                Next::Wait => return false,
            }
        }
    }

    /// The pin thread's results not handed out (`(task, worker, state)`, as `HandOuts.record`
    /// takes them), older than any still owed.
    pub fn note_all(&mut self, tags: Vec<(u64, usize, Option<WorkerState>)>) {
        for (_, worker, state) in tags {
            self.note(worker, state);
        }
    }
}

/// What a multi-worker iterator has handed out this epoch, and what it measures. Each iterator
/// holds one as its field `hand_out`, which [`iterator_methods!`] reads.
pub struct HandOutState {
    /// Batches handed out this epoch (as batches or as their errors), and whether the epoch
    /// ended: what `DataLoader.state_dict()` counts as consumed (NOTE [Resume]).
    taken: u64,
    finished: bool,
    /// Which tasks were handed out, by which worker (handouts.rs says who records what with
    /// pin_memory).
    handouts: Py<HandOuts>,
    /// What `len()` measures: the loader's index sampler, as in torch (None for the pin
    /// thread's PoolIter, whose `PinnedBatches` answers it, and once cleared).
    length_of: Option<Py<PyAny>>,
    /// For an iterable dataset whose `len(loader)` was asked: warns when it is exceeded.
    len_warning: Option<LengthWarning>,
    /// Where this epoch's time went (`DataLoader.stats()`).
    stats: Py<Stats>,
}

impl HandOutState {
    /// Nothing handed out yet, by `num_workers` workers.
    pub fn new(
        py: Python<'_>,
        num_workers: usize,
        length_of: Option<Py<PyAny>>,
        reported_len: Option<(Py<PyAny>, usize)>,
        stats: Py<Stats>,
    ) -> PyResult<Self> {
        Ok(HandOutState {
            taken: 0,
            finished: false,
            handouts: Py::new(py, HandOuts::new(num_workers))?,
            length_of,
            len_warning: LengthWarning::new(reported_len, true),
            stats,
        })
    }

    pub fn stats(&self) -> &Stats {
        self.stats.get()
    }

    /// The record of what was handed out, to add a worker's dataset state to.
    pub fn handouts<'py>(&self, py: Python<'py>) -> PyRefMut<'py, HandOuts> {
        self.handouts.bind(py).borrow_mut()
    }

    /// A result (a batch or its error) is handed out: it answered `task`, made by `worker`,
    /// whose dataset state after it was `state` (None: unchanged, or not said).
    pub fn record(&mut self, py: Python<'_>, task: u64, worker: usize, state: Option<WorkerState>) {
        self.taken += 1;
        self.handouts(py).record(task, worker, state);
    }

    /// The epoch has ended: nothing more will be handed out.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// A batch reaches the user: counted against the length `len(loader)` reported.
    pub fn yielded(&mut self, py: Python<'_>) -> PyResult<()> {
        match &mut self.len_warning {
            Some(warning) => warning.yielded(py),
            None => Ok(()),
        }
    }

    /// A new epoch (persistent workers): nothing handed out, no time spent.
    pub fn new_epoch(&mut self, py: Python<'_>, reported_len: Option<(Py<PyAny>, usize)>) {
        self.taken = 0;
        self.finished = false;
        self.handouts(py).reset();
        self.stats().clear();
        self.len_warning = LengthWarning::new(reported_len, true);
    }

    /// A new epoch of persistent workers over a map-style dataset goes on from `drained`: each
    /// worker's dataset state is where its last result of the abandoned epoch left it, handed
    /// out or not.
    pub fn start_from(&mut self, py: Python<'_>, drained: Drained) {
        let mut handouts = self.handouts(py);
        for (worker, state) in drained.0.into_iter().enumerate() {
            if let Some(state) = state {
                handouts.set_start_state(worker, state);
            }
        }
    }

    /// `len(iterator)`.
    pub fn len(&self, py: Python<'_>) -> PyResult<usize> {
        match &self.length_of {
            Some(length_of) => length_of.bind(py).len(),
            None => Err(no_length()),
        }
    }

    /// (batches handed out this epoch, whether the epoch ended); see `taken`.
    pub fn progress(&self) -> (u64, bool) {
        (self.taken, self.finished)
    }

    pub fn stats_object(&self, py: Python<'_>) -> Py<Stats> {
        self.stats.clone_ref(py)
    }

    pub fn handouts_object(&self, py: Python<'_>) -> Py<HandOuts> {
        self.handouts.clone_ref(py)
    }

    /// Lets the garbage collector see what this holds of the user's, and the results that
    /// `scheduler` holds until their turn to be handed out.
    pub fn traverse(
        &self,
        visit: &PyVisit<'_>,
        scheduler: &Scheduler<Answer>,
    ) -> Result<(), PyTraverseError> {
        visit.call(&self.handouts)?;
        visit.call(&self.length_of)?;
        if let Some(warning) = &self.len_warning {
            warning.traverse(visit)?;
        }
        for answer in scheduler.results() {
            answer.traverse(visit)?;
        }
        Ok(())
    }

    /// What the garbage collector clears: the user's objects.
    pub fn clear(&mut self) {
        self.length_of = None;
        self.len_warning = None;
    }
}

/// The Python methods both multi-worker iterators share, over their field `hand_out`
/// ([`HandOutState`]): a second `#[pymethods]` block for `$iter` (pyo3's `multiple-pymethods`),
/// beside its own. `$iter` has a method `next_handed_out(slf) -> PyResult<Option<batch>>`,
/// `__next__` without its timing.
macro_rules! iterator_methods {
    ($iter:ident) => {
        #[pyo3::pymethods]
        impl $iter {
            fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
                slf
            }

            fn __next__<'py>(slf: PyRefMut<'py, Self>) -> PyResult<Option<Bound<'py, PyAny>>> {
                let stats = slf.hand_out.stats_object(slf.py());
                stats.get().next_called();
                let next = Self::next_handed_out(slf);
                stats.get().next_returned(matches!(next, Ok(Some(_))));
                next
            }

            fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
                self.hand_out.len(py)
            }

            /// Iterators do not pickle: torch's error.
            fn __reduce__(&self) -> PyResult<()> {
                Err($crate::errors::not_picklable(stringify!($iter)))
            }

            /// (batches handed out this epoch, whether the epoch ended).
            #[getter]
            fn _progress(&self) -> (u64, bool) {
                self.hand_out.progress()
            }

            /// This epoch's `Stats`.
            #[getter]
            fn _stats(&self, py: Python<'_>) -> Py<$crate::stats::Stats> {
                self.hand_out.stats_object(py)
            }

            /// What was handed out this epoch (handout/handouts.rs).
            #[getter]
            fn _handouts(&self, py: Python<'_>) -> Py<$crate::handout::HandOuts> {
                self.hand_out.handouts_object(py)
            }
        }
    };
}
pub(crate) use iterator_methods;
