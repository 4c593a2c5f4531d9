//! The cross-process hand-off between rloader's main process and its worker processes:
//! pure Rust, no Python.
//!
//! Workers are started by Python's multiprocessing (fork, spawn or forkserver), so a
//! worker finds its channels by a *descriptor*: the main process creates a [`ShmRegion`]
//! (anonymous shared memory, a memfd: it never has a name, so nothing is left in /dev/shm
//! whichever process dies), lays out [`Ring`]s and a [`Doorbell`] in it, and each worker maps
//! it through the descriptor it inherits (fork) or is passed (spawn, forkserver), at offsets
//! both sides compute alike.
//!
//! * [`Ring`]: one direction of one worker's channel, single producer, single consumer,
//!   messages of any length (index batches one way, pickled batches of tens of MB the
//!   other). Lock-free positions, futex sleeps, no spinning.
//! * [`Doorbell`]: one counter every worker's ring bumps, so the main process sleeps until
//!   *any* worker has sent something.
//!
//! The protocol, and why no wake-up is lost, is NOTE [Ring protocol] in `protocol.rs`.
//!
//! Linux only (futex). Model check: `RUSTFLAGS="--cfg loom" cargo test -p rloader-queue
//! --release loom` (under loom only the protocol is built, over loom's atomics).

// Under loom only the protocol and its model checks are built: much of it goes unused.
#![cfg_attr(loom, allow(dead_code))]

mod error;
mod protocol;
mod sync;

#[cfg(not(loom))]
mod doorbell;
#[cfg(not(loom))]
mod ring;
#[cfg(not(loom))]
mod shm;

#[cfg(not(loom))]
pub use doorbell::Doorbell;
pub use error::QueueError;
#[cfg(not(loom))]
pub use ring::Ring;
#[cfg(not(loom))]
pub use shm::ShmRegion;

/// The longest message a ring carries (the frame header's 48-bit length).
pub const MAX_MESSAGE_LEN: u64 = protocol::MAX_MESSAGE_LEN;
