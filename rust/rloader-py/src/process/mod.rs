//! Loading with worker processes (`num_workers>0`): where a batch crosses the process boundary.
//!
//! - `region.rs`: `PoolRegion`, the shared memory of a loader's pools (doorbell, rings, batch
//!   slots), kept from one pool to the next;
//! - `pool/`: `PoolIter`, the main process's side, by job: drawing the tasks and sending them
//!   into the workers' rings (`tasks.rs`, NOTE [Unsent]), starting the workers one by one
//!   (`start.rs`, NOTE [Staged start]), taking their answers in (`answers.rs`);
//! - `worker.rs`: `worker_loop`, a worker process's side: it fetches and collates each task's
//!   batch, into its shared-memory slot where it can, and sends the answer back;
//! - `key_feed.rs`: `KeyFeed`, keys drawn on the main thread for the pin thread's `PoolIter`
//!   (NOTE [Key feed]).
//!
//! The pure-Rust half (scheduler, messages, region layout, slots) is rloader-workers'; the rings
//! and doorbell are rloader-queue's.

mod key_feed;
mod pool;
mod region;
mod worker;

pub use key_feed::KeyFeed;
pub use pool::PoolIter;
pub use region::PoolRegion;
pub use worker::worker_loop;
