//! `PinnedSlots`: a pool region's batch slots registered with the accelerator's driver, so
//! that batches from worker processes are pinned where the workers wrote them (NOTE [Pinned
//! slots] in rloader-workers' pinned.rs says why it is safe: release after the device read,
//! unregister before unmapping). `PinnedBlocks`: the same driver calls for the recycled batch
//! memory of thread workers and the single-process loop (NOTE [Pinned blocks] in
//! rloader-memory).
//!
//! The driver calls are the Python side's (`rloader._pinning.cuda_host.slot_pinning`: torch's
//! `cudart()` and `torch.cuda.Event`), so that the same code runs on the CPU with stand-ins in the
//! tests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::PyRuntimeWarning;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use rloader_memory::{Fence, Pinning, Release};
use rloader_queue::ShmRegion;
use rloader_workers::pinned::{reclaim, Parked, Registration, Registrations};
use rloader_workers::slots::SlotLease;

pub struct PinnedSlots {
    /// Kept mapped until every range is unregistered (this is dropped first).
    shm: Arc<ShmRegion>,
    /// `register(addr, len)` (raises if the driver refuses), `unregister(addr)`, and
    /// `fence()`: an event recorded on the current stream, with `query()` and `synchronize()`.
    register: Py<PyAny>,
    unregister: Py<PyAny>,
    fence: Py<PyAny>,
    /// Only the process that registered unregisters (a forked child holds a copy of this).
    owner: u32,
    registrations: Mutex<Registrations>,
    /// Guarded briefly: never held while Python runs (a fence's check may drop a batch, whose
    /// release parks here).
    parked: Mutex<Vec<Parked<PyFence>>>,
    /// The driver refused a registration once: from then on batches are copied into pinned
    /// memory by the pin thread, as without this.
    failed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl PinnedSlots {
    pub fn new(
        shm: Arc<ShmRegion>,
        register: Py<PyAny>,
        unregister: Py<PyAny>,
        fence: Py<PyAny>,
    ) -> Self {
        PinnedSlots {
            shm,
            register,
            unregister,
            fence,
            owner: std::process::id(),
            registrations: Mutex::new(Registrations::default()),
            parked: Mutex::new(Vec::new()),
            failed: AtomicBool::new(false),
        }
    }

    /// Makes the first `needed` bytes of the slot at `slot_at` registered; false if they are
    /// not (the driver refused, now or before: the caller's lease is then an ordinary one).
    /// Called only for a slot the main process has just leased, whose earlier releases have all
    /// been reclaimed (its worker wrote into it): no device read of it is in flight.
    pub fn ensure(&self, py: Python<'_>, slot_at: usize, needed: usize) -> bool {
        let plan = lock(&self.registrations).plan(slot_at, needed);
        let Registration::Register { replace, len } = plan else {
            // Registered (before a refusal too): its batch is pinned, so it must be fenced.
            return true;
        };
        let addr = self.shm.as_ptr() as usize + slot_at;
        if self.failed.load(Ordering::Relaxed) {
            // Not registered again after a refusal; a batch that outgrew its slot's range
            // must not lie half in it (it would read as pinned and not be copied).
            if replace {
                if let Err(err) = self.unregister.call1(py, (addr,)) {
                    err.write_unraisable(py, None);
                }
                lock(&self.registrations).unregistered(slot_at);
            }
            return false;
        }
        let result = (|| -> PyResult<()> {
            if replace {
                self.unregister.call1(py, (addr,))?;
                lock(&self.registrations).unregistered(slot_at);
            }
            self.register.call1(py, (addr, len))?;
            lock(&self.registrations).registered(slot_at, len);
            Ok(())
        })();
        if let Err(err) = result {
            self.failed.store(true, Ordering::Relaxed);
            warn_refused(py, &err);
            return false;
        }
        true
    }

    /// A leased slot whose batch is gone (its `Lease` is being freed): it goes back to its
    /// worker once the device has read it (events recorded now, NOTE [Pinned slots]). Also
    /// frees earlier ones now done. Runs inside a deallocation, so the exception being raised
    /// meanwhile, if any, is kept.
    pub fn release(&self, lease: SlotLease) {
        if std::process::id() != self.owner {
            // A forked child's copy of the parent's batch: the slot is the parent's affair.
            std::mem::forget(lease);
            return;
        }
        // At exit nothing is called, and the lease goes with the closure: no device work will
        // be waited for.
        quietly(|py| {
            match self.fence.call0(py) {
                Ok(fence) => lock(&self.parked).push((lease, PyFence::new(fence, self.owner))),
                Err(err) => {
                    // Without an event the slot never goes back (its worker sends inline):
                    // better than overwriting what the device may still read.
                    err.write_unraisable(py, None);
                    std::mem::forget(lease);
                }
            }
            self.reclaim();
        });
    }

    /// Frees every parked slot whose event has completed. A fence that cannot say (its query
    /// raised) keeps its slot for good, as in `release` (`PyFence::done`).
    pub fn reclaim(&self) {
        let parked = std::mem::take(&mut *lock(&self.parked));
        if parked.is_empty() {
            return;
        }
        let still = reclaim(parked, PyFence::done);
        lock(&self.parked).extend(still);
    }

    /// Slots waiting for their events, and slots registered (for tests).
    pub fn counts(&self) -> (usize, usize) {
        (lock(&self.parked).len(), lock(&self.registrations).len())
    }
}

impl Drop for PinnedSlots {
    fn drop(&mut self) {
        let parked = std::mem::take(&mut *lock(&self.parked));
        let slots = lock(&self.registrations).drain();
        if std::process::id() != self.owner {
            // A forked child registered nothing, and its parent owns the parked slots' states.
            std::mem::forget(parked);
            return;
        }
        // At exit nothing is called: the driver lets go of everything; torch may be half gone.
        quietly(|py| {
            for (lease, fence) in parked {
                if fence.wait() {
                    drop(lease);
                } else {
                    std::mem::forget(lease);
                }
            }
            let base = self.shm.as_ptr() as usize;
            for slot_at in slots {
                if let Err(err) = self.unregister.call1(py, (base + slot_at,)) {
                    err.write_unraisable(py, None);
                }
            }
        });
    }
}

/// The driver's registration refused: batches are copied into pinned memory from now on.
fn warn_refused(py: Python<'_>, err: &PyErr) {
    let text = format!(
        "rloader could not pin batches where they are ({err}); they are copied into pinned \
         memory instead"
    );
    let category = py.get_type::<PyRuntimeWarning>();
    let msg = std::ffi::CString::new(text).unwrap_or_default();
    if let Err(warned) = PyErr::warn(py, &category, &msg, 1) {
        warned.write_unraisable(py, None);
    }
}

/// Runs `f` with the GIL, keeping the exception being raised meanwhile, if any (these calls run
/// inside deallocations); None at interpreter exit, when nothing must be called.
fn quietly<T>(f: impl FnOnce(Python<'_>) -> T) -> Option<T> {
    Python::try_attach(|py| {
        // Taken before anything calls Python: a call made with an exception set fails (and
        // would lose it).
        let pending = PyErr::take(py);
        let out = (!finalizing(py)).then(|| f(py));
        if let Some(pending) = pending {
            pending.restore(py);
        }
        out
    })
    .flatten()
}

/// The driver calls for pinned batch blocks (`rloader._pinning.cuda_host.slot_pinning`'s,
/// NOTE [Pinned blocks]).
pub struct PinnedBlocks {
    register: Py<PyAny>,
    unregister: Py<PyAny>,
    fence: Py<PyAny>,
    /// Only the process that registered unregisters or fences (a forked child's copy of a batch
    /// is its own memory, which no device reads).
    owner: u32,
    /// The driver refused once: no more registrations.
    failed: AtomicBool,
}

impl PinnedBlocks {
    pub fn new(register: Py<PyAny>, unregister: Py<PyAny>, fence: Py<PyAny>) -> Self {
        PinnedBlocks {
            register,
            unregister,
            fence,
            owner: std::process::id(),
            failed: AtomicBool::new(false),
        }
    }

    fn mine(&self) -> bool {
        std::process::id() == self.owner
    }
}

impl Pinning for PinnedBlocks {
    fn register(&self, addr: usize, len: usize) -> bool {
        if !self.mine() || self.failed.load(Ordering::Relaxed) {
            return false;
        }
        quietly(|py| match self.register.call1(py, (addr, len)) {
            Ok(_) => true,
            Err(err) => {
                self.failed.store(true, Ordering::Relaxed);
                warn_refused(py, &err);
                false
            }
        })
        .unwrap_or(false)
    }

    fn unregister(&self, addr: usize) {
        if self.mine() {
            quietly(|py| {
                if let Err(err) = self.unregister.call1(py, (addr,)) {
                    err.write_unraisable(py, None);
                }
            });
        }
    }

    fn release(&self) -> Release {
        if !self.mine() {
            return Release::Now;
        }
        quietly(|py| match self.fence.call0(py) {
            Ok(fence) => Release::After(Box::new(PyFence::new(fence, self.owner))),
            Err(err) => {
                // Better a block never reused than one the device may still read; and no more
                // registrations, whose blocks would go the same way.
                err.write_unraisable(py, None);
                self.failed.store(true, Ordering::Relaxed);
                Release::Never
            }
        })
        .unwrap_or(Release::Now) // at exit: no device work will be waited for
    }
}

/// A `fence()` object: `query()` and `synchronize()`, as `torch.cuda.Event`'s; the fence of a
/// parked slot or of a free block.
pub struct PyFence {
    fence: Py<PyAny>,
    /// In a forked child (holding copies of the parent's free blocks) no device read is
    /// pending: the memory is the child's own.
    owner: u32,
    /// Its query raised once: it cannot tell, and is asked no more.
    broken: AtomicBool,
}

impl PyFence {
    fn new(fence: Py<PyAny>, owner: u32) -> Self {
        PyFence {
            fence,
            owner,
            broken: AtomicBool::new(false),
        }
    }
}

impl Fence for PyFence {
    fn done(&self) -> bool {
        if std::process::id() != self.owner {
            return true;
        }
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        let done = quietly(|py| {
            let done = self.fence.call_method0(py, "query");
            match done.and_then(|done| done.extract::<bool>(py)) {
                Ok(done) => done,
                Err(err) => {
                    err.write_unraisable(py, None);
                    self.broken.store(true, Ordering::Relaxed);
                    false
                }
            }
        });
        done.unwrap_or(true) // at exit
    }

    fn wait(&self) -> bool {
        if std::process::id() != self.owner {
            return true;
        }
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        quietly(|py| match self.fence.call_method0(py, "synchronize") {
            Ok(_) => true,
            Err(err) => {
                err.write_unraisable(py, None);
                false
            }
        })
        .unwrap_or(true) // at exit: the driver lets go of everything
    }
}

/// `sys.is_finalizing()` (looked up once: it is asked at every release).
fn finalizing(py: Python<'_>) -> bool {
    static IS_FINALIZING: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    IS_FINALIZING
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("sys")?.getattr("is_finalizing")?.unbind())
        })
        .and_then(|f| f.call0(py)?.extract::<bool>(py))
        .unwrap_or(true)
}
