//! Shared memory for the pool: an anonymous region (`memfd_create`), shared with worker
//! processes through its descriptor. It never has a name, so nothing is ever left in /dev/shm
//! whichever process dies, and /dev/shm's size does not limit it.

use std::ffi::CString;
use std::io;
use std::ptr::NonNull;

use crate::QueueError;

/// An anonymous shared-memory region (`memfd_create` + `mmap`), mapped once, read-write.
///
/// Other processes map the same bytes through its descriptor ([`ShmRegion::fd`]: inherited
/// under fork, passed with the process by multiprocessing otherwise) with
/// [`ShmRegion::from_fd`]. Each handle keeps its own descriptor open, for
/// [`ShmRegion::commit`]; the memory lives until the last handle (or descriptor) is gone.
#[derive(Debug)]
pub struct ShmRegion {
    ptr: NonNull<u8>,
    len: usize,
    /// What the region is for, in error messages (and /proc/<pid>/maps).
    what: String,
    fd: Fd,
}

// SAFETY: the region is plain shared memory; what may touch which bytes is the business of
// the types built on it (Ring, Doorbell), which only use atomics and protocol-owned ranges.
unsafe impl Send for ShmRegion {}
unsafe impl Sync for ShmRegion {}

fn os(op: &str, what: &str) -> impl FnOnce(io::Error) -> QueueError {
    let op = format!("{op}({what:?})");
    move |source| QueueError::Os { op, source }
}

/// A file descriptor closed on every path.
#[derive(Debug)]
struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor.
        unsafe { libc::close(self.0) };
    }
}

/// posix_fallocate of `[offset, offset + len)`: no room (the machine's or its cgroup's memory
/// is full) is [`QueueError::NoMemory`], here rather than a SIGBUS on first touch later.
fn reserve(fd: &Fd, what: &str, offset: usize, len: usize) -> Result<(), QueueError> {
    if len == 0 {
        return Ok(());
    }
    let too_big = |_| QueueError::TooSmall {
        what: "the file offset type",
        need: offset.saturating_add(len),
        got: libc::off_t::MAX as usize,
    };
    let off = libc::off_t::try_from(offset).map_err(too_big)?;
    let n = libc::off_t::try_from(len).map_err(too_big)?;
    loop {
        // SAFETY: an fd we own. posix_fallocate returns the error number itself.
        match unsafe { libc::posix_fallocate(fd.0, off, n) } {
            0 => return Ok(()),
            libc::EINTR => continue,
            libc::ENOSPC | libc::EFBIG | libc::ENOMEM => {
                return Err(QueueError::NoMemory {
                    what: what.to_owned(),
                    requested: len,
                })
            }
            errno => {
                return Err(os("posix_fallocate", what)(io::Error::from_raw_os_error(
                    errno,
                )))
            }
        }
    }
}

/// The size of the file behind `fd`, which must not be empty.
fn file_len(fd: &Fd, what: &str) -> Result<usize, QueueError> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: an fd we own and a buffer fstat fills.
    if unsafe { libc::fstat(fd.0, st.as_mut_ptr()) } != 0 {
        return Err(os("fstat", what)(io::Error::last_os_error()));
    }
    // SAFETY: fstat succeeded.
    let size = unsafe { st.assume_init() }.st_size;
    let len = usize::try_from(size).unwrap_or(0);
    if len == 0 {
        return Err(QueueError::TooSmall {
            what: "the shared-memory region (still being created?)",
            need: 1,
            got: 0,
        });
    }
    Ok(len)
}

fn map(fd: &Fd, len: usize, what: &str) -> Result<NonNull<u8>, QueueError> {
    // SAFETY: a fresh shared mapping of an fd we hold; the kernel picks the address.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.0,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(os("mmap", what)(io::Error::last_os_error()));
    }
    Ok(NonNull::new(ptr.cast()).expect("mmap returned a non-null address"))
}

impl ShmRegion {
    /// A new anonymous region of `len` bytes. It is sparse: only the first `commit` bytes are
    /// reserved now; the rest is a hole that costs nothing until [`ShmRegion::commit`] reserves
    /// a part of it (from any process that maps the region). Touching bytes that were never
    /// committed may SIGBUS when memory is short: commit first. `what` names it in error
    /// messages.
    pub fn create_anonymous(
        what: &str,
        len: usize,
        commit: usize,
    ) -> Result<ShmRegion, QueueError> {
        if len == 0 {
            return Err(QueueError::TooSmall {
                what: "a shared-memory region",
                need: 1,
                got: 0,
            });
        }
        let cname = CString::new(what.replace('\0', "_")).expect("NUL replaced");
        // SAFETY: a NUL-terminated name; the flags are valid.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(os("memfd_create", what)(io::Error::last_os_error()));
        }
        let fd = Fd(raw);
        let off_len = libc::off_t::try_from(len).map_err(|_| QueueError::TooSmall {
            what: "the file offset type",
            need: len,
            got: libc::off_t::MAX as usize,
        })?;
        // SAFETY: an fd we own.
        if unsafe { libc::ftruncate(fd.0, off_len) } != 0 {
            return Err(os("ftruncate", what)(io::Error::last_os_error()));
        }
        reserve(&fd, what, 0, commit.min(len))?;
        ShmRegion::map_fd(fd, len, what)
    }

    /// Maps the region behind `fd` (from [`ShmRegion::create_anonymous`] in another process),
    /// taking ownership of the descriptor, which it keeps for [`ShmRegion::commit`].
    ///
    /// # Safety
    /// `fd` is an open descriptor of a shared-memory file that nothing else will close.
    pub unsafe fn from_fd(fd: std::os::fd::RawFd, what: &str) -> Result<ShmRegion, QueueError> {
        let fd = Fd(fd);
        let len = file_len(&fd, what)?;
        ShmRegion::map_fd(fd, len, what)
    }

    /// A handle on the `len` bytes of the region behind `fd`, which it keeps.
    fn map_fd(fd: Fd, len: usize, what: &str) -> Result<ShmRegion, QueueError> {
        let ptr = map(&fd, len, what)?;
        Ok(ShmRegion {
            ptr,
            len,
            what: what.to_owned(),
            fd,
        })
    }

    /// The descriptor this handle keeps open (valid while the handle lives).
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.fd.0
    }

    /// Reserves `len` bytes of memory at `offset` (see [`ShmRegion::create_anonymous`]): no
    /// room is a [`QueueError::NoMemory`] here. Committing a committed range again is a cheap
    /// no-op.
    pub fn commit(&self, offset: usize, len: usize) -> Result<(), QueueError> {
        if offset.checked_add(len).map_or(true, |end| end > self.len) {
            return Err(QueueError::TooSmall {
                what: "the region, for the range to commit",
                need: offset.saturating_add(len),
                got: self.len,
            });
        }
        reserve(&self.fd, &self.what, offset, len)
    }

    /// Maps this process's page tables over `[offset, offset + len)`, a committed range, ahead
    /// of use. A process writing a fresh mapping of shared memory otherwise takes one page
    /// fault per 4 KiB page written; populating for reading maps the pages 16 at a time (the
    /// kernel's fault-around), and they are writable since a shared-memory mapping needs no
    /// dirty tracking: populating costs a fraction of what the faults would.
    /// Best effort: false where the kernel refused (MADV_POPULATE_READ is Linux 5.14+), and the
    /// pages then simply fault as they are written. An empty range is true.
    pub fn populate(&self, offset: usize, len: usize) -> bool {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let start = offset / page * page;
        let end = offset.saturating_add(len).min(self.len);
        if end <= start {
            return true;
        }
        // SAFETY: a page-aligned range inside our mapping; the advice changes no contents.
        let rc = unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(start).cast(),
                end - start,
                libc::MADV_POPULATE_READ,
            )
        };
        rc == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: regions are at least one byte long.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the mapping (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; nothing borrows from it past `self`
        // (Ring and Doorbell hold an Arc<ShmRegion>). The descriptor closes after.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes of memory the region's file holds (what has been reserved).
    fn reserved(r: &ShmRegion) -> u64 {
        let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: a descriptor the region keeps open and a buffer fstat fills.
        assert_eq!(unsafe { libc::fstat(r.fd(), st.as_mut_ptr()) }, 0);
        // SAFETY: fstat succeeded.
        #[allow(clippy::unnecessary_cast)]
        let blocks = unsafe { st.assume_init() }.st_blocks as u64;
        blocks * 512
    }

    /// A second handle on `r`, as a worker maps it through the descriptor it was passed.
    fn peer(r: &ShmRegion) -> ShmRegion {
        // SAFETY: dup gives a descriptor that the new handle then owns alone.
        unsafe { ShmRegion::from_fd(libc::dup(r.fd()), "rloader test") }.unwrap()
    }

    #[test]
    fn zero_length_is_refused() {
        assert!(matches!(
            ShmRegion::create_anonymous("rloader test", 0, 0),
            Err(QueueError::TooSmall { .. })
        ));
    }

    #[test]
    fn anonymous_regions_share_through_their_descriptor() {
        let a = ShmRegion::create_anonymous("rloader test", 1 << 30, 4096).unwrap();
        assert_eq!(a.len(), 1 << 30);
        let b = peer(&a);
        assert_eq!(b.len(), 1 << 30);
        b.commit(256 << 20, 4096).unwrap();
        // SAFETY: committed bytes of a mapping both handles share; single-threaded test.
        unsafe {
            *b.as_ptr().add(256 << 20) = 3;
            assert_eq!(*a.as_ptr().add(256 << 20), 3);
        }
        assert!(matches!(
            b.commit(1 << 30, 1),
            Err(QueueError::TooSmall { .. })
        ));
        // The memory outlives the handle that made it.
        drop(a);
        // SAFETY: as above.
        assert_eq!(unsafe { *b.as_ptr().add(256 << 20) }, 3);
        // (Running out of memory is not provoked here: unlike /dev/shm, a memfd has no size
        // limit to hit first, and the kernel may kill the test process instead.)
    }

    #[test]
    fn sparse_regions_reserve_only_what_is_committed() {
        let a = ShmRegion::create_anonymous("rloader test", 1 << 30, 8192).unwrap();
        assert!(reserved(&a) < 1 << 20, "{}", reserved(&a));
        let b = peer(&a);
        b.commit(512 << 20, 2 << 20).unwrap();
        b.commit(512 << 20, 2 << 20).unwrap(); // again: a no-op
        let bytes = reserved(&a);
        assert!((2 << 20..4 << 20).contains(&bytes), "{bytes}");
        // SAFETY: a committed byte of a mapping both handles share; single-threaded test.
        unsafe {
            *b.as_ptr().add((512 << 20) + 5) = 9;
            assert_eq!(*a.as_ptr().add((512 << 20) + 5), 9);
        }
        assert!(matches!(
            b.commit((1 << 30) - 10, 11),
            Err(QueueError::TooSmall { .. })
        ));
        assert!(matches!(
            b.commit(usize::MAX, 2),
            Err(QueueError::TooSmall { .. })
        ));
    }

    #[test]
    fn from_fd_refuses_an_empty_file() {
        // SAFETY: a fresh descriptor the handle would own.
        let raw = unsafe { libc::memfd_create(c"rloader empty".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: as above.
        let err = unsafe { ShmRegion::from_fd(raw, "rloader empty") }.unwrap_err();
        assert!(matches!(err, QueueError::TooSmall { .. }), "{err}");
    }

    /// Whether this process's page tables map the page at `addr` (/proc/self/pagemap bit 63).
    fn mapped(addr: *const u8) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let page = 4096u64;
        let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
        f.seek(SeekFrom::Start(addr as u64 / page * 8)).unwrap();
        let mut entry = [0u8; 8];
        f.read_exact(&mut entry).unwrap();
        u64::from_le_bytes(entry) >> 63 == 1
    }

    #[test]
    fn populate_maps_written_pages_in_a_fresh_mapping() {
        let a = ShmRegion::create_anonymous("rloader test", 64 << 20, 0).unwrap();
        let (at, len) = (8 << 20, 64 << 10);
        a.commit(at, len).unwrap();
        // SAFETY: committed bytes; single-threaded test.
        unsafe { std::ptr::write_bytes(a.as_ptr().add(at), 7, len) };
        let b = peer(&a);
        let pages = |r: &ShmRegion| -> Vec<bool> {
            let base = r.as_ptr().wrapping_add(at);
            (0..len)
                .step_by(4096)
                .map(|o| mapped(base.wrapping_add(o)))
                .collect()
        };
        assert!(
            pages(&b).iter().all(|&m| !m),
            "a fresh mapping starts without page tables"
        );
        assert!(
            b.populate(at + 1, len - 1), // an unaligned start covers its whole page
            "madvise(MADV_POPULATE_READ) refused: Linux 5.14 or later is needed"
        );
        assert!(pages(&b).iter().all(|&m| m));
        // SAFETY: committed bytes, read after the writes above.
        assert!(
            unsafe { std::slice::from_raw_parts(b.as_ptr().add(at), len) }
                .iter()
                .all(|&x| x == 7)
        );
        assert!(b.populate(b.len() - 4096, 1 << 20)); // clamped to the region
        assert!(b.populate(b.len(), 4096)); // empty: nothing to do
    }
}
