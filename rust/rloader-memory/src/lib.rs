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
//!
//! NOTE [Pinned blocks]
//! With a [`Pinning`] set (`pin_memory=True` on CUDA), a block is registered with the
//! accelerator's driver (page-locked where it lies) when it is first taken, so its batch needs
//! no copy into pinned memory. Such a batch may be read by the device after the user dropped it
//! (a copy made with `non_blocking=True` is only queued), so a returned block comes back with
//! the [`Fence`] its release made (events on the current streams), and `take` hands it out again
//! only once that fence is done. A block evicted from the free list, or returned after its pool
//! is gone, is unmapped only after its fence is waited for, and unregistered first. A fence
//! that cannot tell (its driver failed) keeps its block mapped for good: leaked, never
//! overwritten. The fences and the driver are called without the free list's lock held: they
//! run Python, which may drop another batch, whose block comes back through the same lock.
//! Pinned pools keep up to twice as many free blocks as were ever out at once (torch's
//! pinned-memory allocator keeps every block it made), and round block sizes up to size
//! classes (`block_len`), so batches of varying sizes share blocks: registering is far dearer
//! than reusing. A pinned pool's blocks are shared mappings (`MAP_SHARED`), not private
//! ones: at `fork()` Linux copies at once every private page that may be pinned for the
//! device (instead of sharing it copy-on-write), so registered private blocks would cost each
//! worker process started later a copy of all of them (on a 16-core GPU host, ~220 ms a fork
//! with ~1 GB of blocks), while shared pages are never copied. A forked child sees the same
//! bytes, so its copy of a pool never hands out the parent's blocks: every block and pool
//! remembers the process it is for, and in another one `take` maps a fresh private block,
//! and a dropped batch's block is only unmapped there (never returned, never unregistered).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// The accelerator driver's side of pinned blocks (NOTE [Pinned blocks]).
pub trait Pinning: Send + Sync {
    /// Registers `len` bytes at `addr` (page-locks them); false if the driver refused.
    fn register(&self, addr: usize, len: usize) -> bool;
    /// Undoes `register`, before the bytes are unmapped.
    fn unregister(&self, addr: usize);
    /// What a block whose batch was just dropped waits for before it is written again.
    fn release(&self) -> Release;
}

/// Device work recorded when a pinned block's batch was dropped.
pub trait Fence: Send + Sync {
    /// Whether the device is done with the block (false also when the fence cannot tell).
    fn done(&self) -> bool;
    /// Waits until it is; false if the fence cannot tell (the block must then never be
    /// unmapped).
    fn wait(&self) -> bool;
}

/// [`Pinning::release`]'s answer.
pub enum Release {
    /// No device work to wait for (nothing used the device, or the process is exiting).
    Now,
    /// Free once the fence is done.
    After(Box<dyn Fence>),
    /// No fence could be made: the block is never reused nor unmapped.
    Never,
}

/// One anonymous mapping of whole pages, private or (pinned pools) shared, unmapped on drop
/// (unregistered first if it is registered).
pub struct Block {
    ptr: NonNull<u8>,
    len: usize,
    /// A shared mapping (NOTE [Pinned blocks]): the only kind a pinned pool registers.
    shared: bool,
    /// The process that mapped it: a forked child neither reuses nor unregisters it.
    process: u32,
    /// Some while registered with this driver.
    pinned: Option<Arc<dyn Pinning>>,
}

// SAFETY: a Block is plain memory owned by one party at a time (NOTE [Batch memory]); a
// shared `&Block` only reads its address and length.
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

impl Block {
    fn map(len: usize, shared: bool) -> std::io::Result<Block> {
        let kind = if shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
        // SAFETY: a fresh anonymous mapping, touching no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                kind | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Block {
            ptr,
            len,
            shared,
            process: std::process::id(),
            pinned: None,
        })
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(pinning) = self.pinned.take() {
            if self.process == std::process::id() {
                pinning.unregister(self.ptr.as_ptr() as usize);
            } // (a forked child's copy of the mapping was never registered)
        }
        // SAFETY: the mapping is ours alone (NOTE [Batch memory]) and nothing refers to it now.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Drops a block once the device is done with it (NOTE [Pinned blocks]).
fn retire(block: Block, fence: Option<Arc<dyn Fence>>) {
    match fence {
        Some(fence) if !fence.wait() => std::mem::forget(block),
        _ => drop(block),
    }
}

/// The length of the block that serves `len` bytes: whole pages; for a pinned pool, rounded up
/// to an eighth of the next power of two (at most 12.5% more), so that batches whose sizes
/// vary (padded to their longest sample, say) still reuse registered blocks instead of
/// registering one per size. (torch's pinned-memory allocator rounds to the power of two.)
fn block_len(len: usize, pinned: bool) -> usize {
    let page = page_size();
    let len = len.max(1).next_multiple_of(page);
    if !pinned {
        return len;
    }
    let step = (len.checked_next_power_of_two().unwrap_or(len) / 8).max(page);
    len.next_multiple_of(step)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096).max(1)
}

/// A free block, with the fence its last batch's release made (None once it is done).
type FreeBlock = (Block, Option<Arc<dyn Fence>>);

struct Free {
    /// The process the pool is for (a forked child has a copy of it).
    process: u32,
    blocks: Vec<FreeBlock>,
    max_free: usize,
    pinning: Option<Arc<dyn Pinning>>,
    /// Blocks out in batches now, and the most there ever were.
    out: usize,
    peak_out: usize,
}

impl Free {
    fn capacity(&self) -> usize {
        match self.pinning {
            // Blocks waiting for their fences are free too: room for as many as were ever out.
            Some(_) => self.max_free.max(2 * self.peak_out),
            None => self.max_free,
        }
    }
}

impl Drop for Free {
    fn drop(&mut self) {
        for (block, fence) in self.blocks.drain(..) {
            retire(block, fence);
        }
    }
}

fn lock(free: &Mutex<Free>) -> MutexGuard<'_, Free> {
    free.lock().unwrap_or_else(|e| e.into_inner())
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
                process: std::process::id(),
                blocks: Vec::new(),
                max_free,
                pinning: None,
                out: 0,
                peak_out: 0,
            })),
        }
    }

    /// Pins the blocks handed out from now on (NOTE [Pinned blocks]); false if the pool already
    /// had a `Pinning` (which it keeps).
    pub fn set_pinning(&self, pinning: Arc<dyn Pinning>) -> bool {
        let mut free = lock(&self.free);
        if free.pinning.is_some() {
            return false;
        }
        free.pinning = Some(pinning);
        true
    }

    /// Whether blocks are pinned (`set_pinning` was called).
    pub fn is_pinning(&self) -> bool {
        lock(&self.free).pinning.is_some()
    }

    /// A block of at least `len` bytes: a free one of that many pages whose device reads are
    /// done, else a new mapping; registered if the pool pins. Its contents are whatever its last
    /// batch left (the caller overwrites them).
    pub fn take(&self, len: usize) -> std::io::Result<PooledBlock> {
        let (ready, fenced, pinning, len) = {
            let mut free = lock(&self.free);
            if free.process != std::process::id() {
                // A forked child's copy of the pool: its free blocks may be the parent's (a
                // pinned pool's are shared with it), so it hands out fresh private blocks.
                return Ok(PooledBlock {
                    block: Some(Block::map(block_len(len, false), false)?),
                    home: Weak::new(),
                });
            }
            let pinning = free.pinning.clone();
            let len = block_len(len, pinning.is_some());
            // (a pinned pool's blocks are shared; one mapped before `set_pinning` is not used)
            let fits = |b: &Block| b.len == len && b.shared == pinning.is_some();
            let ready = free
                .blocks
                .iter()
                .rposition(|(b, fence)| fits(b) && fence.is_none());
            match ready {
                // (`remove`, not `swap_remove`: the list stays oldest first, for eviction)
                Some(i) => (Some(free.blocks.remove(i).0), Vec::new(), pinning, len),
                None => {
                    // Fenced blocks of this size, oldest (likeliest done) first: asked below,
                    // without the lock, while they stay in the list (other takes see them).
                    let fenced: Vec<(usize, Arc<dyn Fence>)> = free
                        .blocks
                        .iter()
                        .filter(|(b, _)| fits(b))
                        .filter_map(|(b, f)| Some((b.ptr.as_ptr() as usize, f.clone()?)))
                        .collect();
                    (None, fenced, pinning, len)
                }
            }
        };
        let mut block = match ready {
            Some(block) => Some(block),
            None => self.first_done(fenced),
        };
        if block.is_none() {
            block = Some(Block::map(len, pinning.is_some())?);
        }
        let mut block = block.expect("a block was found or mapped");
        if let (Some(pinning), None, true) = (&pinning, &block.pinned, block.shared) {
            if pinning.register(block.ptr.as_ptr() as usize, block.len) {
                block.pinned = Some(pinning.clone());
            }
        }
        let mut free = lock(&self.free);
        free.out += 1;
        free.peak_out = free.peak_out.max(free.out);
        Ok(PooledBlock {
            block: Some(block),
            home: Arc::downgrade(&self.free),
        })
    }

    /// A free block among `fenced` (address and fence, oldest first) whose fence is done and
    /// which is still free with that fence, taken off the free list.
    fn first_done(&self, fenced: Vec<(usize, Arc<dyn Fence>)>) -> Option<Block> {
        for (addr, fence) in fenced {
            if !fence.done() {
                continue;
            }
            let mut free = lock(&self.free);
            let same = |f: &Option<Arc<dyn Fence>>| {
                f.as_ref()
                    .is_some_and(|f| std::ptr::addr_eq(Arc::as_ptr(f), Arc::as_ptr(&fence)))
            };
            let found = free
                .blocks
                .iter()
                .position(|(b, f)| b.ptr.as_ptr() as usize == addr && same(f));
            if let Some(i) = found {
                return Some(free.blocks.remove(i).0);
            }
            // Another take got it first.
        }
        None
    }

    /// How many blocks are free, fenced or not (for tests).
    pub fn free_blocks(&self) -> usize {
        lock(&self.free).blocks.len()
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

    /// Whether the block is registered with the accelerator's driver.
    pub fn is_pinned(&self) -> bool {
        self.block.as_ref().is_some_and(|b| b.pinned.is_some())
    }
}

impl Drop for PooledBlock {
    fn drop(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        if block.process != std::process::id() {
            return; // a batch a forked child inherited: its copy of the mapping just goes
        }
        let fence = match &block.pinned {
            None => None,
            Some(pinning) => match pinning.release() {
                Release::Now => None,
                Release::After(fence) => Some(Arc::from(fence)),
                Release::Never => {
                    std::mem::forget(block);
                    if let Some(home) = self.home.upgrade() {
                        let mut free = lock(&home);
                        free.out = free.out.saturating_sub(1);
                    }
                    return;
                }
            },
        };
        let Some(home) = self.home.upgrade() else {
            return retire(block, fence); // the pool is gone: unmapped once the device is done
        };
        let evicted = {
            let mut free = lock(&home);
            free.out = free.out.saturating_sub(1);
            let capacity = free.capacity();
            if capacity == 0 {
                Some((block, fence))
            } else {
                // The oldest goes: the newest are the sizes the loader makes now.
                let evicted = (free.blocks.len() >= capacity).then(|| free.blocks.remove(0));
                free.blocks.push((block, fence));
                evicted
            }
        };
        if let Some((block, fence)) = evicted {
            retire(block, fence);
        }
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
    /// A driver that records what it is asked, with fences the test completes by hand.
    #[derive(Default)]
    struct FakeDriver {
        log: Mutex<Vec<String>>,
        refuse: std::sync::atomic::AtomicBool,
        never: std::sync::atomic::AtomicBool,
        /// Each fence made: whether it is done.
        fences: Mutex<Vec<Arc<std::sync::atomic::AtomicBool>>>,
        /// Run (once) the next time a fence is asked whether it is done.
        on_done: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    }

    struct FakeFence {
        done: Arc<std::sync::atomic::AtomicBool>,
        driver: Arc<FakeDriver>,
    }

    impl Fence for FakeFence {
        fn done(&self) -> bool {
            let hook = self.driver.on_done.lock().unwrap().take();
            if let Some(hook) = hook {
                hook();
            }
            self.done.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn wait(&self) -> bool {
            self.driver.log.lock().unwrap().push("wait".into());
            self.done.store(true, std::sync::atomic::Ordering::SeqCst);
            true
        }
    }

    /// The `Pinning` handed to the pool: the driver, shared with the test.
    struct Driver(Arc<FakeDriver>);

    impl Pinning for Driver {
        fn register(&self, addr: usize, len: usize) -> bool {
            if self.0.refuse.load(std::sync::atomic::Ordering::SeqCst) {
                return false;
            }
            self.0
                .log
                .lock()
                .unwrap()
                .push(format!("register {addr:x} {len}"));
            true
        }
        fn unregister(&self, addr: usize) {
            self.0
                .log
                .lock()
                .unwrap()
                .push(format!("unregister {addr:x}"));
        }
        fn release(&self) -> Release {
            if self.0.never.load(std::sync::atomic::Ordering::SeqCst) {
                return Release::Never;
            }
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            self.0.fences.lock().unwrap().push(done.clone());
            Release::After(Box::new(FakeFence {
                done,
                driver: self.0.clone(),
            }))
        }
    }

    fn pinned_pool(max_free: usize) -> (BatchMemory, Arc<FakeDriver>) {
        let pool = BatchMemory::new(max_free);
        let driver = Arc::new(FakeDriver::default());
        assert!(pool.set_pinning(Arc::new(Driver(driver.clone()))));
        assert!(
            !pool.set_pinning(Arc::new(Driver(Arc::default()))),
            "the first pinning is kept"
        );
        (pool, driver)
    }

    fn log(driver: &FakeDriver) -> Vec<String> {
        std::mem::take(&mut *driver.log.lock().unwrap())
    }

    /// What a forked child that writes `byte` into the block's first byte leaves there for
    /// this process.
    fn after_child_writes(block: &PooledBlock, byte: u8) -> u8 {
        let ptr = block.as_ptr();
        // SAFETY: the child only writes one byte of a block it inherited and exits at once
        // (no allocation, no lock: safe in a child of a multi-threaded process).
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            unsafe {
                ptr.write_volatile(byte);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        // SAFETY: the block is ours and at least one byte long.
        unsafe { ptr.read_volatile() }
    }

    #[test]
    fn pinned_blocks_are_shared_with_forked_children_and_plain_ones_are_copied_on_write() {
        // Linux copies a child's private pages pinned for the device at fork(): a pinned
        // pool's blocks are shared mappings, which it never copies (NOTE [Pinned blocks]).
        let (pool, _driver) = pinned_pool(4);
        let pinned = pool.take(10_000).unwrap();
        assert!(pinned.is_pinned());
        assert_eq!(after_child_writes(&pinned, 0xAB), 0xAB, "a shared mapping");
        let plain = BatchMemory::new(4).take(10_000).unwrap();
        // SAFETY: the block is ours and at least one byte long.
        unsafe { plain.as_ptr().write(1) };
        assert_eq!(after_child_writes(&plain, 0xAB), 1, "a private mapping");
    }

    #[test]
    fn a_forked_child_takes_fresh_blocks_and_leaves_the_parents_alone() {
        let (pool, driver) = pinned_pool(4);
        let kept = pool.take(10_000).unwrap();
        let free = pool.take(10_000).unwrap();
        let (kept_ptr, free_ptr) = (kept.as_ptr(), free.as_ptr());
        // SAFETY: the blocks are ours and at least one byte long.
        unsafe {
            kept_ptr.write(1);
            free_ptr.write(2);
        }
        drop(free);
        driver.fences.lock().unwrap()[0].store(true, std::sync::atomic::Ordering::SeqCst);
        log(&driver);
        // SAFETY: the child takes a block from its copy of the pool, writes it, drops its copy
        // of a batch, and exits at once (only its own memory; no lock held by another thread is
        // taken: the pool's mutex is this thread's, unlocked).
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let code = match pool.take(10_000) {
                Ok(fresh) if fresh.as_ptr() != free_ptr && !fresh.is_pinned() => {
                    unsafe { fresh.as_ptr().write(9) };
                    drop(fresh);
                    drop(kept); // the parent's batch: not returned, not unregistered here
                    0
                }
                _ => 1,
            };
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        // SAFETY: as above.
        unsafe {
            assert_eq!(
                free_ptr.read(),
                2,
                "the free block was not written by the child"
            );
            assert_eq!(kept_ptr.read(), 1);
        }
        assert_eq!(
            pool.take(10_000).unwrap().as_ptr(),
            free_ptr,
            "the parent reuses it"
        );
        assert!(
            log(&driver).is_empty(),
            "nothing registered or unregistered meanwhile"
        );
    }

    #[test]
    fn a_pinned_pool_leaves_blocks_mapped_before_it_pinned_unregistered() {
        let pool = BatchMemory::new(4);
        let private = pool.take(64 << 10).unwrap();
        let private_ptr = private.as_ptr();
        drop(private);
        let driver = Arc::new(FakeDriver::default());
        assert!(pool.set_pinning(Arc::new(Driver(driver.clone()))));
        let block = pool.take(64 << 10).unwrap();
        assert_ne!(
            block.as_ptr(),
            private_ptr,
            "a private block is never registered"
        );
        assert!(block.is_pinned());
    }

    #[test]
    fn a_pinned_block_is_registered_once_and_reused_only_after_its_fence() {
        let (pool, driver) = pinned_pool(4);
        let a = pool.take(10_000).unwrap();
        let a_ptr = a.as_ptr();
        assert!(a.is_pinned());
        assert_eq!(
            log(&driver),
            [format!("register {:x} {}", a_ptr as usize, a.len())]
        );
        drop(a);
        assert_eq!(pool.free_blocks(), 1);
        let b = pool.take(10_000).unwrap();
        assert_ne!(
            b.as_ptr(),
            a_ptr,
            "the device may still read the dropped batch"
        );
        let fence = driver.fences.lock().unwrap()[0].clone();
        fence.store(true, std::sync::atomic::Ordering::SeqCst);
        let c = pool.take(10_000).unwrap();
        assert_eq!(c.as_ptr(), a_ptr, "once read, the block comes back");
        assert!(c.is_pinned());
        assert_eq!(log(&driver).len(), 1, "b was registered; c was already");
        drop((b, c));
    }

    #[test]
    fn an_evicted_block_waits_for_the_device_then_is_unregistered() {
        let (pool, driver) = pinned_pool(1);
        let a = pool.take(4096).unwrap();
        let a_ptr = a.as_ptr() as usize;
        drop(a);
        let b = pool.take(4096).unwrap(); // a's fence is pending: a new block
        let b_ptr = b.as_ptr() as usize;
        drop(b);
        log(&driver);
        // Peak use is one block, so two free blocks are kept: a third evicts the oldest.
        let c = pool.take(4096).unwrap();
        let c_ptr = c.as_ptr() as usize;
        drop(c);
        assert_eq!(
            log(&driver),
            [
                format!("register {c_ptr:x} 4096"),
                "wait".to_string(),
                format!("unregister {a_ptr:x}"),
            ]
        );
        assert_eq!(pool.free_blocks(), 2);
        drop(pool);
        assert_eq!(
            log(&driver),
            [
                "wait".to_string(),
                format!("unregister {b_ptr:x}"),
                "wait".to_string(),
                format!("unregister {c_ptr:x}"),
            ],
            "a dropped pool waits for its free blocks' fences, then unregisters them"
        );
    }

    #[test]
    fn a_fenced_block_asked_by_two_takes_goes_to_one() {
        // While one take asks a fence (without the lock), another takes the block: the first
        // then maps a new one rather than handing the same block out twice.
        let (pool, driver) = pinned_pool(4);
        let a = pool.take(4096).unwrap();
        let a_ptr = a.as_ptr();
        drop(a);
        driver.fences.lock().unwrap()[0].store(true, std::sync::atomic::Ordering::SeqCst);
        let other = pool.clone();
        let nested = Arc::new(Mutex::new(None));
        let got = nested.clone();
        *driver.on_done.lock().unwrap() = Some(Box::new(move || {
            *got.lock().unwrap() = Some(other.take(4096).unwrap());
        }));
        let outer = pool.take(4096).unwrap();
        let inner = nested.lock().unwrap().take().expect("the nested take ran");
        assert_eq!(
            inner.as_ptr(),
            a_ptr,
            "the block stayed visible to the other take"
        );
        assert_ne!(outer.as_ptr(), a_ptr, "and it is handed out once");
    }

    #[test]
    fn pinned_pools_keep_twice_as_many_free_blocks_as_were_out() {
        let (pool, driver) = pinned_pool(1);
        for _round in 0..2 {
            // Three out at once; the second round's three are new (the first's are fenced).
            let blocks: Vec<_> = (0..3).map(|_| pool.take(4096).unwrap()).collect();
            drop(blocks);
        }
        assert_eq!(
            pool.free_blocks(),
            6,
            "registering again would cost more than keeping"
        );
        assert!(!log(&driver)
            .iter()
            .any(|line| line.starts_with("unregister")));
    }

    #[test]
    fn a_block_returned_after_its_pool_waits_for_the_device() {
        let (pool, driver) = pinned_pool(4);
        let a = pool.take(4096).unwrap();
        let a_ptr = a.as_ptr() as usize;
        drop(pool);
        log(&driver);
        drop(a);
        assert_eq!(
            log(&driver),
            ["wait".to_string(), format!("unregister {a_ptr:x}")]
        );
    }

    #[test]
    fn a_block_without_a_fence_is_never_reused_nor_unmapped() {
        let (pool, driver) = pinned_pool(4);
        let a = pool.take(4096).unwrap();
        let a_ptr = a.as_ptr();
        driver
            .never
            .store(true, std::sync::atomic::Ordering::SeqCst);
        drop(a);
        assert_eq!(pool.free_blocks(), 0);
        assert_eq!(
            lock(&pool.free).out,
            0,
            "the leaked block is no longer counted as out"
        );
        let b = pool.take(4096).unwrap();
        assert_ne!(b.as_ptr(), a_ptr);
        // SAFETY: the leaked block stays mapped (and registered): reading it is fine.
        assert_eq!(unsafe { a_ptr.read_volatile() }, 0);
        log(&driver);
        std::mem::forget(b);
        drop(pool);
        assert!(
            log(&driver).is_empty(),
            "the leaked block is not unregistered"
        );
    }

    #[test]
    fn pinned_blocks_come_in_size_classes_shared_by_nearby_sizes() {
        let (pool, driver) = pinned_pool(4);
        let page = page_size();
        // 33 pages and a byte: 34 pages, in the class of 40 (an eighth of 64 is 8).
        let a = pool.take(33 * page + 1).unwrap();
        assert_eq!(a.len(), 40 * page);
        let a_ptr = a.as_ptr();
        drop(a);
        driver.fences.lock().unwrap()[0].store(true, std::sync::atomic::Ordering::SeqCst);
        let b = pool.take(39 * page).unwrap();
        assert_eq!(
            b.as_ptr(),
            a_ptr,
            "a batch a little larger reuses the registered block"
        );
        assert_eq!(log(&driver).len(), 1, "registered once");
        assert_eq!(
            pool.take(5 * page).unwrap().len(),
            5 * page,
            "small: whole pages"
        );
        let plain = BatchMemory::new(4);
        assert_eq!(
            plain.take(34 * page).unwrap().len(),
            34 * page,
            "unpinned: whole pages"
        );
    }

    #[test]
    fn a_refused_registration_leaves_a_plain_block() {
        let (pool, driver) = pinned_pool(4);
        driver
            .refuse
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let a = pool.take(4096).unwrap();
        assert!(!a.is_pinned());
        let a_ptr = a.as_ptr();
        drop(a);
        assert!(
            driver.fences.lock().unwrap().is_empty(),
            "a plain block needs no fence"
        );
        assert_eq!(pool.take(4096).unwrap().as_ptr(), a_ptr);
    }
}
