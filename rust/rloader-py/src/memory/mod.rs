//! Batch memory as Python sees it: who owns a batch's bytes, who frees them, and where they
//! are pinned.
//!
//! - `export.rs`: the buffer protocol, written once (`ExportedBytes`, `export_bytes!`), with
//!   `Message`, a received worker message, and the reads of numpy arrays and pickle buffers;
//! - `slots.rs`: batch slots in shared memory: a worker's (`SlotView`, `slot_empty`) and the
//!   main process's hold on one (`Lease`), whose drop gives the slot back (NOTE [Slots] in
//!   rloader-workers);
//! - `batch_buffers.rs`: the loader's recycled batch memory (`BatchBuffers`, `PooledView`,
//!   NOTE [Batch memory] in rloader-memory), for the single-process loop and worker threads;
//! - `pinned.rs`: slots and blocks registered with the accelerator's driver, freed only once
//!   the device has read them (`PinnedSlots`, `PinnedBlocks`);
//! - `stacking.rs`: where the batch being fetched will be collated, lent to a dataset that
//!   stacks its samples there itself (`batch_empty`, `StackedSamples`).

mod batch_buffers;
pub mod export;
mod pinned;
pub mod slots;
pub mod stacking;

pub use batch_buffers::{pooled_empty, BatchBuffers, PooledView};
pub use export::{contiguous_bytes, ArrayView, ExportedBytes, Message};
pub use pinned::PinnedSlots;
pub use slots::{slot_empty, Lease, SlotView};
