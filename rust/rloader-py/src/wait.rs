//! Waiting without the GIL.
//!
//! NOTE [Waiting]: nothing in this crate blocks while attached to the interpreter. A thread that
//! waits (for a worker's answer, for room in a worker's ring, for a task, for the next chunk of
//! a sampler's indices) releases the GIL for the wait, so that other Python threads run
//! meanwhile (the training loop, while the pin thread waits for batches), and every such wait
//! goes through this module. A wait on another process is cut into slices of at most `SLICE`
//! (`slice`, `until`): before each slice the thread checks for signals (`py.check_signals()`),
//! so Ctrl-C on the main thread becomes KeyboardInterrupt within a slice, and between slices the
//! caller checks what a slice cannot see (are the workers alive? has `timeout` passed? is the
//! main process still there?). Signals are checked *before* a slice, never after it: what a
//! slice did (a message sent or received) is never lost to the KeyboardInterrupt, which is
//! raised at the next slice. Only the main thread runs Python's signal handlers; elsewhere
//! (the pin thread) the check does nothing, and worker processes ignore SIGINT, so in a worker
//! it only runs a handler the dataset installed.
//!
//! `py.detach` elsewhere in the crate releases the GIL around computing (building a
//! permutation), never around waiting.

use std::time::{Duration, Instant};

use pyo3::prelude::*;
use rloader_queue::{QueueError, Ring};

/// The longest a wait goes without checking for signals (and its caller's checks).
pub const SLICE: Duration = Duration::from_millis(100);

/// The length of the next slice of a wait that ends at `deadline`: `SLICE` at most, zero once
/// the deadline has passed.
fn slice_len(deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
        None => SLICE,
    }
}

/// One slice of a wait: checks for signals, then runs `wait(len)` without the GIL, `len` being
/// at most `SLICE` and ending no later than `deadline` (zero once it has passed: a try).
pub fn slice<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    wait: impl Send + FnOnce(Duration) -> T,
) -> PyResult<T> {
    py.check_signals()?;
    let len = slice_len(deadline);
    Ok(py.detach(|| wait(len)))
}

/// Waits in slices until `step` (one slice of the wait) returns a value, which is returned, or
/// `deadline` passes (None). Before each slice signals are checked; after each slice that
/// found nothing, `between()` runs with the GIL, and may end the wait with a value too.
pub fn until<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    mut step: impl Send + FnMut(Duration) -> Option<T>,
    mut between: impl FnMut() -> PyResult<Option<T>>,
) -> PyResult<Option<T>> {
    loop {
        if let Some(done) = slice(py, deadline, &mut step)? {
            return Ok(Some(done));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        if let Some(done) = between()? {
            return Ok(Some(done));
        }
    }
}

/// A wait that ends by itself within milliseconds (another thread of this process making the
/// next chunk of indices): signals are checked, then `wait()` runs without the GIL, whole.
pub fn briefly<T: Send>(py: Python<'_>, wait: impl Send + FnOnce() -> T) -> PyResult<T> {
    py.check_signals()?;
    Ok(py.detach(wait))
}

/// One slice of sending `parts` as one message on `ring` (a `step` for `until`): None while
/// there is no room yet. A message larger than the ring goes on from where the last slice left
/// it (`Ring::send_partial`), so no slice ever closes the ring.
pub fn send_slice(ring: &Ring, parts: &[&[u8]], len: Duration) -> Option<Result<(), QueueError>> {
    match ring.send_partial(parts, Some(len)) {
        Ok(true) => Some(Ok(())),
        Ok(false) | Err(QueueError::Timeout) => None,
        Err(e) => Some(Err(e)),
    }
}
