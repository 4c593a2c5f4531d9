//! `PoolRegion`: the shared memory of a loader's worker pools.

use std::sync::{Arc, OnceLock};

use pyo3::prelude::*;

use rloader_queue::{Doorbell, Ring, ShmRegion};
use rloader_workers::layout::DOORBELL_AT;
use rloader_workers::{slots, Layout, PoolError};

use crate::errors::to_py;
use crate::memory::PinnedSlots;

/// The shared memory of a loader's worker pools: an anonymous region (memfd), so nothing is ever
/// left in /dev/shm and /dev/shm's size does not limit it. It holds the pool's doorbell, rings
/// and batch slots (`Layout` in rloader-workers' layout.rs). Workers get its descriptor
/// (inherited under fork, passed by multiprocessing otherwise). When a pool is done and its
/// workers are gone, the region serves the loader's next pool: its slots are warm (reserved and
/// mapped), which is most of what a new epoch would otherwise spend.
#[pyclass(module = "rloader._rloader", frozen)]
pub struct PoolRegion {
    pub(crate) shm: Arc<ShmRegion>,
    pub(crate) layout: Layout,
    pub(crate) prefetch_factor: usize,
    /// Set once pinned batches are asked for on CUDA (NOTE [Pinned slots]).
    pub(crate) pinned: OnceLock<Arc<PinnedSlots>>,
}

#[pymethods]
impl PoolRegion {
    #[new]
    fn new(num_workers: usize, prefetch_factor: usize) -> PyResult<Self> {
        if num_workers == 0 {
            return Err(to_py(PoolError::NoWorkers));
        }
        let layout = Layout::new(num_workers, prefetch_factor);
        let shm = layout
            .create_region("rloader DataLoader workers")
            .map_err(to_py)?;
        Ok(PoolRegion {
            shm: Arc::new(shm),
            layout,
            prefetch_factor,
            pinned: OnceLock::new(),
        })
    }

    /// Closes the task and answer rings of the pool using the region, so that its workers
    /// leave: how every pool is stopped (`_Pool.shutdown`, whether the iterator ended, was
    /// dropped, or outlived by a finalizer at interpreter exit).
    fn _close_rings(&self) -> PyResult<()> {
        for (at, len) in self.layout.all_rings() {
            Ring::attach(self.shm.clone(), at, len)
                .map_err(to_py)?
                .close();
        }
        Ok(())
    }

    /// The descriptor workers map the region through.
    #[getter]
    fn fd(&self) -> i32 {
        self.shm.fd()
    }

    /// (slots waiting for the device, slots registered), or None without `_pin_slots` (for
    /// tests).
    #[getter]
    fn _pinned_counts(&self) -> Option<(usize, usize)> {
        self.pinned.get().map(|p| p.counts())
    }

    /// (address, length) of the region in this process (for tests).
    #[getter]
    fn _span(&self) -> (usize, usize) {
        (self.shm.as_ptr() as usize, self.shm.len())
    }

    /// Whether a pool of this shape can use the region.
    fn fits(&self, num_workers: usize, prefetch_factor: usize) -> bool {
        self.layout.num_workers() == num_workers && self.prefetch_factor == prefetch_factor
    }
}

impl PoolRegion {
    /// The region's registrations with the accelerator's driver (NOTE [Pinned slots]), made
    /// with `register(addr, len)`, `unregister(addr)` and `fence()` the first time (the
    /// driver's, from `rloader._pinning.cuda_host.slot_pinning`) and kept for the region's later pools.
    pub fn pinned_slots(
        &self,
        register: Py<PyAny>,
        unregister: Py<PyAny>,
        fence: Py<PyAny>,
    ) -> Arc<PinnedSlots> {
        self.pinned
            .get_or_init(|| {
                Arc::new(PinnedSlots::new(
                    self.shm.clone(),
                    register,
                    unregister,
                    fence,
                ))
            })
            .clone()
    }

    pub fn num_workers(&self) -> usize {
        self.layout.num_workers()
    }

    /// Readies the region for a new pool (the workers of any previous one are gone): fresh
    /// rings and doorbell, and every slot free except those whose batches the user still holds.
    /// Returns the doorbell, the task rings and the answer rings.
    pub fn prepare(&self) -> PyResult<(Doorbell, Vec<Ring>, Vec<Ring>)> {
        let shm = &self.shm;
        let doorbell = Doorbell::init(shm.clone(), DOORBELL_AT);
        let workers = self.num_workers();
        let mut to_workers = Vec::with_capacity(workers);
        let mut from_workers = Vec::with_capacity(workers);
        for w in 0..workers {
            let (task_at, task_len) = self.layout.task_ring(w);
            let (answer_at, answer_len) = self.layout.answer_ring(w);
            to_workers.push(Ring::init(shm.clone(), task_at, task_len).map_err(to_py)?);
            from_workers.push(Ring::init(shm.clone(), answer_at, answer_len).map_err(to_py)?);
        }
        for w in 0..workers {
            for s in 0..self.layout.slots_per_worker() {
                slots::reset_unleased(shm, self.layout.slot(w, s).1);
            }
        }
        Ok((doorbell, to_workers, from_workers))
    }
}
