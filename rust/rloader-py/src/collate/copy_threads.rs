//! How many threads copy one batch, and the copy split over them.

use pyo3::prelude::*;

use crate::torch_api::TorchApi;

/// Batches at least this large are copied on several threads (`copy_threads`).
const SPLIT_COPY_MIN: usize = 1 << 20;
/// At most this many threads copy one batch.
const SPLIT_COPY_THREADS: usize = 4;

thread_local! {
    /// Set on worker threads (threads/), which already collate side by side: each copies
    /// its own batches on its own thread.
    static ONE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread copies the batches it collates by itself (a worker thread).
pub fn copy_on_this_thread_only() {
    ONE_THREAD.with(|one| one.set(true));
}

/// How many threads copy a batch of `total` bytes: `torch.get_num_threads()`, as torch.stack
/// copies large inputs, up to `SPLIT_COPY_THREADS`, for a batch of at least `SPLIT_COPY_MIN`
/// bytes; one on a worker thread, and in a worker process (torch.set_num_threads(1) there, as
/// in torch's workers).
pub fn copy_threads(py: Python<'_>, h: &TorchApi, total: usize) -> PyResult<usize> {
    if total < SPLIT_COPY_MIN || ONE_THREAD.with(|one| one.get()) {
        return Ok(1);
    }
    let n: usize = h.get_num_threads.call0(py)?.extract(py)?;
    Ok(n.clamp(1, SPLIT_COPY_THREADS))
}

/// `copy_rows(first_row, rows)` over `rows` in `threads` contiguous chunks, each on a thread of
/// this call (none outlives it, so a fork never finds one half-way).
pub fn split_copy(rows: &[usize], threads: usize, copy_rows: impl Fn(usize, &[usize]) + Sync) {
    if threads <= 1 || rows.len() < 2 {
        return copy_rows(0, rows);
    }
    let per = rows.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let mut chunks = rows.chunks(per).enumerate();
        let mine = chunks.next();
        for (c, chunk) in chunks {
            let copy_rows = &copy_rows;
            scope.spawn(move || copy_rows(c * per, chunk));
        }
        if let Some((_, chunk)) = mine {
            copy_rows(0, chunk);
        }
    });
}
