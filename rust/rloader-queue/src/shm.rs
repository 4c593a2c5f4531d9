//! Named POSIX shared memory: the only thing a spawned or forkserver worker can find by
//! itself is a name, so every region has one.

use std::ffi::CString;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::QueueError;

/// The longest name `shm_open` accepts on Linux (NAME_MAX, with the leading '/').
const MAX_NAME: usize = 255;

/// A named POSIX shared-memory region (`shm_open` + `mmap`), mapped once, read-write.
///
/// The creator's handle unlinks the name when it is dropped, unless [`ShmRegion::unlink_name`]
/// already did, and only in the process that created it (a forked child holding a copy
/// never unlinks the parent's name). The mapping lives until the handle is dropped, whether
/// or not the name still exists.
#[derive(Debug)]
pub struct ShmRegion {
    ptr: NonNull<u8>,
    len: usize,
    name: String,
    /// The creating process, for the unlink in Drop; None for `open`ed regions.
    creator_pid: Option<libc::pid_t>,
    unlinked: AtomicBool,
    /// Kept open only by [`ShmRegion::open_committable`], for [`ShmRegion::commit`].
    fd: Option<Fd>,
}

// SAFETY: the region is plain shared memory; what may touch which bytes is the business of
// the types built on it (Ring, Doorbell), which only use atomics and protocol-owned ranges.
unsafe impl Send for ShmRegion {}
unsafe impl Sync for ShmRegion {}

fn os(op: &str, name: &str) -> impl FnOnce(io::Error) -> QueueError {
    let op = format!("{op}({name:?})");
    move |source| QueueError::Os { op, source }
}

fn c_name(name: &str) -> Result<CString, QueueError> {
    let valid = name.len() >= 2
        && name.len() <= MAX_NAME
        && name.starts_with('/')
        && !name[1..].contains('/')
        && !name.contains('\0');
    if !valid {
        return Err(QueueError::InvalidName(name.to_owned()));
    }
    Ok(CString::new(name).expect("NUL checked above"))
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

/// Bytes free in /dev/shm, 0 if unknown (only for the error message).
// fsblkcnt_t and c_ulong are narrower than u64 on some targets.
#[allow(clippy::unnecessary_cast)]
fn dev_shm_free() -> u64 {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: a NUL-terminated path and a buffer statvfs fills.
    let rc = unsafe { libc::statvfs(c"/dev/shm".as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: statvfs succeeded, so it filled the struct.
    let st = unsafe { st.assume_init() };
    (st.f_bavail as u64).saturating_mul(st.f_frsize as u64)
}

/// posix_fallocate of `[offset, offset + len)`; no room is [`QueueError::NoSpace`] for a named
/// region (in /dev/shm), [`QueueError::NoMemory`] for an anonymous one.
fn reserve(fd: &Fd, name: &str, offset: usize, len: usize) -> Result<(), QueueError> {
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
            libc::ENOSPC | libc::EFBIG | libc::ENOMEM if !name.starts_with('/') => {
                return Err(QueueError::NoMemory {
                    what: name.to_owned(),
                    requested: len,
                })
            }
            libc::ENOSPC | libc::EFBIG => {
                return Err(QueueError::NoSpace {
                    name: name.to_owned(),
                    requested: len,
                    free: dev_shm_free(),
                })
            }
            errno => {
                return Err(os("posix_fallocate", name)(io::Error::from_raw_os_error(
                    errno,
                )))
            }
        }
    }
}

/// The size of the file behind `fd`, which must not be empty.
fn file_len(fd: &Fd, name: &str) -> Result<usize, QueueError> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: an fd we own and a buffer fstat fills.
    if unsafe { libc::fstat(fd.0, st.as_mut_ptr()) } != 0 {
        return Err(os("fstat", name)(io::Error::last_os_error()));
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

fn map(fd: &Fd, len: usize, name: &str) -> Result<NonNull<u8>, QueueError> {
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
        return Err(os("mmap", name)(io::Error::last_os_error()));
    }
    Ok(NonNull::new(ptr.cast()).expect("mmap returned a non-null address"))
}

impl ShmRegion {
    /// Creates the name (`O_CREAT | O_EXCL`, mode 0600) and reserves `len` bytes of
    /// `/dev/shm` now, with `posix_fallocate`: a full `/dev/shm` is a
    /// [`QueueError::NoSpace`] here, never a SIGBUS on first touch later.
    pub fn create(name: &str, len: usize) -> Result<ShmRegion, QueueError> {
        ShmRegion::create_sparse(name, len, len)
    }

    /// As [`ShmRegion::create`], but only the first `commit` bytes are reserved now; the rest
    /// is a hole that costs nothing until [`ShmRegion::commit`] reserves a part of it (from
    /// any process that opened the region with [`ShmRegion::open_committable`]). Touching
    /// bytes that were never committed may SIGBUS when /dev/shm is full: commit first.
    pub fn create_sparse(name: &str, len: usize, commit: usize) -> Result<ShmRegion, QueueError> {
        let cname = c_name(name)?;
        if len == 0 {
            return Err(QueueError::TooSmall {
                what: "a shared-memory region",
                need: 1,
                got: 0,
            });
        }
        // SAFETY: a NUL-terminated name.
        let raw = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600,
            )
        };
        if raw < 0 {
            return Err(os("shm_open", name)(io::Error::last_os_error()));
        }
        let fd = Fd(raw);
        let unlink_on_error = |e: QueueError| {
            // SAFETY: a NUL-terminated name; we created it just now.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
            e
        };
        let Ok(off_len) = libc::off_t::try_from(len) else {
            return Err(unlink_on_error(QueueError::TooSmall {
                what: "the file offset type",
                need: len,
                got: libc::off_t::MAX as usize,
            }));
        };
        // SAFETY: an fd we own.
        if unsafe { libc::ftruncate(fd.0, off_len) } != 0 {
            return Err(unlink_on_error(os("ftruncate", name)(
                io::Error::last_os_error(),
            )));
        }
        reserve(&fd, name, 0, commit.min(len)).map_err(unlink_on_error)?;
        let ptr = map(&fd, len, name).map_err(unlink_on_error)?;
        Ok(ShmRegion {
            ptr,
            len,
            name: name.to_owned(),
            // SAFETY: getpid cannot fail.
            creator_pid: Some(unsafe { libc::getpid() }),
            unlinked: AtomicBool::new(false),
            fd: None,
        })
    }

    /// An anonymous region (`memfd_create`): no name in /dev/shm (nothing can be left behind,
    /// and /dev/shm's size does not limit it), shared with other processes by its descriptor
    /// ([`ShmRegion::fd`], inherited or passed), which this handle keeps open. Sparse like
    /// [`ShmRegion::create_sparse`]: the first `commit` bytes are reserved now. `what` names it
    /// in error messages.
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
        ShmRegion::map_anonymous(fd, len, what)
    }

    /// Maps the region behind `fd` (from [`ShmRegion::create_anonymous`] in another process),
    /// taking ownership of the descriptor, which it keeps for [`ShmRegion::commit`].
    ///
    /// # Safety
    /// `fd` is an open descriptor of a shared-memory file that nothing else will close.
    pub unsafe fn from_fd(fd: std::os::fd::RawFd, what: &str) -> Result<ShmRegion, QueueError> {
        let fd = Fd(fd);
        let len = file_len(&fd, what)?;
        ShmRegion::map_anonymous(fd, len, what)
    }

    /// A handle on the `len` bytes of the anonymous region behind `fd`, which it keeps.
    fn map_anonymous(fd: Fd, len: usize, what: &str) -> Result<ShmRegion, QueueError> {
        let ptr = map(&fd, len, what)?;
        Ok(ShmRegion {
            ptr,
            len,
            name: what.to_owned(),
            creator_pid: None,
            unlinked: AtomicBool::new(true), // it never had a name
            fd: Some(fd),
        })
    }

    /// The descriptor this handle keeps open, if it keeps one.
    pub fn fd(&self) -> Option<std::os::fd::RawFd> {
        self.fd.as_ref().map(|fd| fd.0)
    }

    /// Maps a region another process created, by name; its length is the region's size.
    pub fn open(name: &str) -> Result<ShmRegion, QueueError> {
        ShmRegion::open_with(name, false)
    }

    /// As [`ShmRegion::open`], keeping the file descriptor open so that this handle can
    /// [`ShmRegion::commit`] parts of a sparse region (one descriptor per handle).
    pub fn open_committable(name: &str) -> Result<ShmRegion, QueueError> {
        ShmRegion::open_with(name, true)
    }

    fn open_with(name: &str, keep_fd: bool) -> Result<ShmRegion, QueueError> {
        let cname = c_name(name)?;
        // SAFETY: a NUL-terminated name.
        let raw = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOENT) {
                return Err(QueueError::Os {
                    op: format!(
                        "shm_open({name:?}) (it does not exist: the creating process has \
                         unlinked it already, or exited)"
                    ),
                    source: e,
                });
            }
            return Err(os("shm_open", name)(e));
        }
        let fd = Fd(raw);
        let len = file_len(&fd, name)?;
        let ptr = map(&fd, len, name)?;
        Ok(ShmRegion {
            ptr,
            len,
            name: name.to_owned(),
            creator_pid: None,
            unlinked: AtomicBool::new(false),
            fd: keep_fd.then_some(fd),
        })
    }

    /// Reserves `len` bytes of `/dev/shm` at `offset` of a sparse region (see
    /// [`ShmRegion::create_sparse`]): a full `/dev/shm` is a [`QueueError::NoSpace`] here.
    /// Committing a committed range again is a cheap no-op.
    pub fn commit(&self, offset: usize, len: usize) -> Result<(), QueueError> {
        let Some(fd) = &self.fd else {
            return Err(QueueError::Os {
                op: format!(
                    "commit({:?}): the region was not opened to commit",
                    self.name
                ),
                source: io::Error::from_raw_os_error(libc::EBADF),
            });
        };
        if offset.checked_add(len).map_or(true, |end| end > self.len) {
            return Err(QueueError::TooSmall {
                what: "the region, for the range to commit",
                need: offset.saturating_add(len),
                got: self.len,
            });
        }
        reserve(fd, &self.name, offset, len)
    }

    /// Maps this process's page tables over `[offset, offset + len)`, a committed range, ahead
    /// of use. A process writing a fresh mapping of shared memory otherwise takes one page
    /// fault per 4 KiB page written; populating for reading maps the pages 16 at a time (the
    /// kernel's fault-around), and they are writable since a shared-memory mapping needs no
    /// dirty tracking: a 9.6 MB batch then takes ~0.5 ms here instead of ~2.5 ms of faults.
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

    /// Removes `name` from `/dev/shm`; mappings stay valid. A name already gone is Ok. The
    /// creator calls this as soon as every peer has opened the region. On the creator's own
    /// handle prefer [`ShmRegion::unlink_name`], which also stops its Drop from unlinking.
    pub fn unlink(name: &str) -> Result<(), QueueError> {
        let cname = c_name(name)?;
        // SAFETY: a NUL-terminated name.
        if unsafe { libc::shm_unlink(cname.as_ptr()) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(os("shm_unlink", name)(e));
            }
        }
        Ok(())
    }

    /// [`ShmRegion::unlink`] of this region's name, at most once per handle.
    pub fn unlink_name(&self) -> Result<(), QueueError> {
        if self.unlinked.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        ShmRegion::unlink(&self.name)
    }

    pub fn name(&self) -> &str {
        &self.name
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
        // (Ring and Doorbell hold an Arc<ShmRegion>).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        // SAFETY: getpid cannot fail.
        if self.creator_pid == Some(unsafe { libc::getpid() }) {
            let _ = self.unlink_name();
        }
    }
}

/// `"/rloader-<pid>-<counter>-<tag>"`: a fresh name per call in this process (a forked
/// child has another pid, so it cannot collide with its parent). `tag` is for people
/// reading `ls /dev/shm`; characters other than `[A-Za-z0-9_.-]` become `_`.
pub fn unique_name(tag: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() };
    let mut name = format!("/rloader-{pid}-{n}-");
    name.extend(
        tag.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(MAX_NAME - name.len()),
    );
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_dev_shm(name: &str) -> bool {
        std::path::Path::new("/dev/shm").join(&name[1..]).exists()
    }

    #[test]
    fn unique_names_are_unique_and_valid() {
        let a = unique_name("index/queue 1");
        let b = unique_name("index/queue 1");
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("/rloader-{}-", std::process::id())));
        assert!(a.ends_with("-index_queue_1"));
        assert!(c_name(&a).is_ok());
        assert!(c_name(&unique_name(&"x".repeat(1000))).is_ok());
    }

    #[test]
    fn invalid_names_are_refused() {
        for bad in ["", "/", "noslash", "/a/b", "/a\0b"] {
            assert!(
                matches!(ShmRegion::create(bad, 64), Err(QueueError::InvalidName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn create_open_share_bytes_and_drop_unlinks() {
        let name = unique_name("shm-test");
        let a = ShmRegion::create(&name, 10_000).unwrap();
        assert_eq!(a.len(), 10_000);
        assert!(in_dev_shm(&name));
        let b = ShmRegion::open(&name).unwrap();
        assert_eq!(b.len(), 10_000);
        // SAFETY: both map the same 10_000 bytes; single-threaded test.
        unsafe {
            *a.as_ptr().add(9_999) = 42;
            assert_eq!(*b.as_ptr().add(9_999), 42);
        }
        // Exclusive create: a second one with the same name fails.
        assert!(matches!(
            ShmRegion::create(&name, 64),
            Err(QueueError::Os { .. })
        ));
        drop(b); // an opener never unlinks
        assert!(in_dev_shm(&name));
        drop(a);
        assert!(!in_dev_shm(&name));
        let e = ShmRegion::open(&name).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    #[test]
    fn unlink_keeps_mappings_and_tolerates_enoent() {
        let name = unique_name("unlink-test");
        let a = ShmRegion::create(&name, 4096).unwrap();
        let b = ShmRegion::open(&name).unwrap();
        a.unlink_name().unwrap();
        assert!(!in_dev_shm(&name));
        ShmRegion::unlink(&name).unwrap(); // ENOENT is fine
        a.unlink_name().unwrap(); // twice is fine
                                  // SAFETY: single-threaded test, both map the same page.
        unsafe {
            *a.as_ptr() = 7;
            assert_eq!(*b.as_ptr(), 7);
        }
    }

    #[test]
    fn zero_length_is_refused() {
        let name = unique_name("zero");
        assert!(matches!(
            ShmRegion::create(&name, 0),
            Err(QueueError::TooSmall { .. })
        ));
        assert!(!in_dev_shm(&name));
    }

    fn blocks_of(name: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(std::path::Path::new("/dev/shm").join(&name[1..]))
            .unwrap()
            .blocks()
            * 512
    }

    #[test]
    fn sparse_regions_reserve_only_what_is_committed() {
        let name = unique_name("sparse");
        let a = ShmRegion::create_sparse(&name, 1 << 30, 8192).unwrap();
        assert_eq!(a.len(), 1 << 30);
        assert!(blocks_of(&name) < 1 << 20, "{}", blocks_of(&name));
        let b = ShmRegion::open_committable(&name).unwrap();
        assert_eq!(b.len(), 1 << 30);
        b.commit(512 << 20, 2 << 20).unwrap();
        b.commit(512 << 20, 2 << 20).unwrap(); // again: a no-op
        let blocks = blocks_of(&name);
        assert!((2 << 20..4 << 20).contains(&blocks), "{blocks}");
        // SAFETY: a committed byte of a mapping both handles share; single-threaded test.
        unsafe {
            *b.as_ptr().add((512 << 20) + 5) = 9;
            assert_eq!(*a.as_ptr().add((512 << 20) + 5), 9);
        }
        // Out of range, and a handle opened without its descriptor.
        assert!(matches!(
            b.commit((1 << 30) - 10, 11),
            Err(QueueError::TooSmall { .. })
        ));
        assert!(matches!(
            b.commit(usize::MAX, 2),
            Err(QueueError::TooSmall { .. })
        ));
        let c = ShmRegion::open(&name).unwrap();
        assert!(c
            .commit(0, 10)
            .unwrap_err()
            .to_string()
            .contains("not opened to commit"));
    }

    #[test]
    fn anonymous_regions_share_through_their_descriptor() {
        let a = ShmRegion::create_anonymous("rloader test", 1 << 30, 4096).unwrap();
        assert_eq!(a.len(), 1 << 30);
        // SAFETY: dup gives a descriptor that `b` then owns alone.
        let b = unsafe { ShmRegion::from_fd(libc::dup(a.fd().unwrap()), "rloader test") }.unwrap();
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
        // (Running out of memory is not provoked here: unlike /dev/shm, a memfd has no size
        // limit to hit first, and the kernel may kill the test process instead.)
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
        // SAFETY: dup gives a descriptor that `b` then owns alone.
        let b = unsafe { ShmRegion::from_fd(libc::dup(a.fd().unwrap()), "rloader test") }.unwrap();
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

    #[test]
    fn committing_more_than_dev_shm_is_no_space_error() {
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: as in dev_shm_free.
        if unsafe { libc::statvfs(c"/dev/shm".as_ptr(), st.as_mut_ptr()) } != 0 {
            return;
        }
        // SAFETY: statvfs succeeded.
        let st = unsafe { st.assume_init() };
        #[allow(clippy::unnecessary_cast)]
        let total = (st.f_blocks as u64).saturating_mul(st.f_frsize as u64) as usize;
        if total == 0 || total > (1 << 50) {
            return;
        }
        let name = unique_name("sparse-full");
        let a = ShmRegion::create_sparse(&name, total * 3, 4096).unwrap();
        let b = ShmRegion::open_committable(&name).unwrap();
        match b.commit(total / 2, total * 2) {
            Err(QueueError::NoSpace { requested, .. }) => assert_eq!(requested, total * 2),
            other => panic!("expected NoSpace, got {other:?}"),
        }
        drop((a, b));
        assert!(!in_dev_shm(&name));
    }

    /// tmpfs refuses a fallocate larger than the whole filesystem up front, without
    /// allocating anything, so this provokes the real ENOSPC path without filling /dev/shm.
    #[test]
    fn larger_than_dev_shm_is_no_space_error() {
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: as in dev_shm_free.
        if unsafe { libc::statvfs(c"/dev/shm".as_ptr(), st.as_mut_ptr()) } != 0 {
            return;
        }
        // SAFETY: statvfs succeeded.
        let st = unsafe { st.assume_init() };
        #[allow(clippy::unnecessary_cast)]
        let total = (st.f_blocks as u64).saturating_mul(st.f_frsize as u64);
        if total == 0 || total > (1 << 50) {
            return; // no size limit to exceed
        }
        let name = unique_name("too-big");
        let requested = (total * 2) as usize;
        let started = std::time::Instant::now();
        match ShmRegion::create(&name, requested) {
            Err(QueueError::NoSpace {
                requested: r, free, ..
            }) => {
                assert_eq!(r, requested);
                assert!(free <= total);
            }
            other => panic!("expected NoSpace, got {other:?}"),
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert!(!in_dev_shm(&name));
    }
}
