//! Worker orchestration for rloader's multi-process DataLoader: pure Rust, no Python.
//!
//! The binding crate (`rloader-py`) runs the pool: its `PoolIter` in the main process and
//! `worker_loop` in each worker. Everything of the pool that does not need the interpreter
//! lives here, where `cargo test` reaches it:
//! - [`scheduler`]: which task goes to which worker, and which result is handed out next
//!   (torch's account of tasks in flight and its reordering);
//! - [`handouts`]: which tasks have been handed out, small even out of order (for resuming);
//! - [`wire`]: the pool's messages, their header and the DATA table that says where a batch's
//!   bytes are (NOTE [Pool protocol]);
//! - [`layout`]: where the doorbell, the rings and the batch slots lie in a pool's region;
//! - [`slots`]: the batch slots' state machine, who owns a slot's bytes when (NOTE [Slots]);
//! - [`pinned`]: slots registered with the accelerator's driver, and freeing them only after
//!   the device has read them (NOTE [Pinned slots]);
//! - [`times`]: each worker's fetch and collate time, summed in the region for the main
//!   process's `DataLoader.stats()`;
//! - [`gil_probe`]: how often the main process's loading holds the GIL, sampled from a thread
//!   of its own (`worker_type="auto"` chooses its first pool's kind by it);
//! - [`parent`]: a worker watching its main process, so that it never outlives it;
//! - [`thread_cpu`]: a thread's own CPU time, which worker threads add up per job (a thread
//!   pool's CPU use for `num_workers="auto"`, apart from the rest of the process);
//! - [`PoolError`]: what can go wrong, which the binding crate maps to Python exceptions.
//!
//! The hand-off itself (rings and doorbell in shared memory) is `rloader-queue`'s.

mod error;
pub mod gil_probe;
pub mod handouts;
pub mod layout;
pub mod parent;
pub mod pinned;
pub mod scheduler;
pub mod slots;
pub mod thread_cpu;
pub mod times;
pub mod wire;

pub use error::PoolError;
pub use handouts::HandedOutTasks;
pub use layout::Layout;
pub use parent::MainProcess;
pub use scheduler::{Next, Scheduler};
