//! Batch memory that stays mapped: blocks handed back by dropped batches are handed out again.
//!
//! A loader makes one batch of the same size after another. Allocated afresh each time (glibc
//! malloc, which torch's CPU allocator calls), a large batch's memory is often new to the
//! process: glibc serves it with `mmap` until its dynamic threshold has risen past the batch
//! size, and afterwards from the top of its heap, which it gives back (`brk` down) whenever more
//! than its trim threshold lies free there. Whether a given batch lands on pages the process
//! already has depends on everything else the process allocated, so one run faults every page
//! of every batch in and the next none. A [`BatchMemory`] keeps the blocks of dropped batches
//! mapped, and a batch of the same size reuses one: its pages are faulted in once.
//!
//! NOTE [Batch memory]
//! A [`Block`] is owned by exactly one party at a time: the pool's free list, or one
//! [`PooledBlock`] (the bytes of one batch tensor, held by whatever exports them to Python).
//! `take` moves a block off the free list into a new `PooledBlock`; only dropping that
//! `PooledBlock` (after the last tensor over its bytes is gone) moves it back. So a block is
//! never written for a new batch while any batch over it is alive, and the bytes of a batch the
//! user keeps are never overwritten. A `PooledBlock` refers to its pool weakly: when the pool is
//! gone (its loader was collected) a returned block is unmapped instead. The free list is
//! bounded (`max_free` blocks), so the memory held beyond the batches alive is at most that many
//! blocks, until the pool is dropped.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

/// One anonymous private mapping of whole pages, unmapped on drop.
pub struct Block {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Block is plain memory owned by one party at a time (NOTE [Batch memory]); a
// shared `&Block` only reads its address and length.
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

impl Block {
    fn map(len: usize) -> std::io::Result<Block> {
        // SAFETY: a fresh anonymous mapping, touching no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Block { ptr, len })
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours alone (NOTE [Batch memory]) and nothing refers to it now.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096).max(1)
}

struct Free {
    blocks: Vec<Block>,
    max_free: usize,
}

/// A pool of batch blocks, shared by the loader that makes batches and the batches it made.
#[derive(Clone)]
pub struct BatchMemory {
    free: Arc<Mutex<Free>>,
}

impl BatchMemory {
    /// A pool that keeps at most `max_free` blocks nobody uses.
    pub fn new(max_free: usize) -> Self {
        BatchMemory {
            free: Arc::new(Mutex::new(Free {
                blocks: Vec::new(),
                max_free,
            })),
        }
    }

    /// A block of at least `len` bytes: a free one of that many pages, else a new mapping.
    /// Its contents are whatever its last batch left (the caller overwrites them).
    pub fn take(&self, len: usize) -> std::io::Result<PooledBlock> {
        let len = len.max(1).next_multiple_of(page_size());
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let found = free.blocks.iter().rposition(|b| b.len == len);
            found.map(|i| free.blocks.swap_remove(i))
        };
        let block = match reused {
            Some(block) => block,
            None => Block::map(len)?,
        };
        Ok(PooledBlock {
            block: Some(block),
            home: Arc::downgrade(&self.free),
        })
    }

    /// How many blocks are free (for tests).
    pub fn free_blocks(&self) -> usize {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .blocks
            .len()
    }
}

/// The bytes of one batch tensor; back to its pool when dropped.
pub struct PooledBlock {
    block: Option<Block>,
    home: Weak<Mutex<Free>>,
}

impl PooledBlock {
    pub fn as_ptr(&self) -> *mut u8 {
        self.block
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.ptr.as_ptr())
    }

    /// The block's length: whole pages, at least what was asked for.
    pub fn len(&self) -> usize {
        self.block.as_ref().map_or(0, |b| b.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for PooledBlock {
    fn drop(&mut self) {
        let (Some(block), Some(home)) = (self.block.take(), self.home.upgrade()) else {
            return; // the pool is gone: the block unmaps itself
        };
        let mut free = home.lock().unwrap_or_else(|e| e.into_inner());
        if free.max_free == 0 {
            return;
        }
        if free.blocks.len() >= free.max_free {
            // The oldest goes: the newest are the sizes the loader makes now.
            free.blocks.remove(0);
        }
        free.blocks.push(block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_block_is_reused_and_a_kept_one_is_not() {
        let pool = BatchMemory::new(4);
        let a = pool.take(10_000).unwrap();
        assert!(a.len() >= 10_000 && a.len() % page_size() == 0);
        let a_ptr = a.as_ptr();
        // SAFETY: the block is ours and at least 10_000 bytes long.
        unsafe { a_ptr.write_bytes(7, 10_000) };
        let b = pool.take(10_000).unwrap();
        assert_ne!(
            b.as_ptr(),
            a_ptr,
            "a block in use is never handed out again"
        );
        drop(a);
        assert_eq!(pool.free_blocks(), 1);
        let c = pool.take(10_000).unwrap();
        assert_eq!(c.as_ptr(), a_ptr, "the dropped block comes back");
        assert_eq!(pool.free_blocks(), 0);
        drop((b, c));
        assert_eq!(pool.free_blocks(), 2);
    }

    #[test]
    fn sizes_do_not_mix_and_the_free_list_is_bounded() {
        let pool = BatchMemory::new(2);
        let page = page_size();
        let small = pool.take(page).unwrap();
        drop(small);
        let big = pool.take(3 * page).unwrap();
        assert_eq!(big.len(), 3 * page);
        assert_eq!(
            pool.free_blocks(),
            1,
            "the small block is not given for a big batch"
        );
        let more: Vec<_> = (0..3).map(|_| pool.take(5 * page).unwrap()).collect();
        drop(more);
        drop(big);
        assert_eq!(pool.free_blocks(), 2);
    }

    #[test]
    fn blocks_outlive_their_pool() {
        let pool = BatchMemory::new(4);
        let a = pool.take(100).unwrap();
        drop(pool);
        // SAFETY: the block is still mapped: it is ours until dropped.
        unsafe { a.as_ptr().write_bytes(1, a.len()) };
        drop(a); // unmapped, not returned
    }
}
