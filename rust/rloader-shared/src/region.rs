//! A container's memory: an anonymous file (memfd), written once by its builder, then sealed
//! and mapped read-only by every process that uses it.
//!
//! The memfd has no name in any file system (not /dev/shm, whose size therefore does not limit
//! it): it lives while some process maps it or holds its descriptor, and the kernel frees it
//! when the last one goes, however that process ends. Its seals (no write, no resize, no more
//! seals) are set before any other process sees it, so every process reads the same bytes for
//! as long as it maps them, and a process that is sent the descriptor checks the seals before
//! trusting the bytes to stay as they are.

use std::ffi::c_void;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{Advice, MapFlags, ProtFlags};

use crate::SharedError;

/// The seals every container's memfd carries.
const SEALS: SealFlags = SealFlags::WRITE
    .union(SealFlags::SHRINK)
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A mapping of `len` bytes of `fd`, unmapped on drop.
struct Mapping {
    ptr: NonNull<c_void>,
    len: usize,
}

// SAFETY: a plain memory mapping; who may write to it is the business of its owner
// (WritableRegion: only through &mut; SealedRegion: nobody, the file is sealed).
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, len: usize, prot: ProtFlags) -> Result<Mapping, SharedError> {
        // SAFETY: a fresh shared mapping of a file we hold; the kernel picks the address.
        let ptr =
            unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }
                .map_err(|e| SharedError::os("mmap", e))?;
        Ok(Mapping {
            ptr: NonNull::new(ptr).expect("mmap returned a non-null address"),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; every borrow of it ended with its owner.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr(), self.len) };
    }
}

/// A region being built: a memfd of fixed length, mapped writable in this process only.
pub struct WritableRegion {
    fd: OwnedFd,
    map: Mapping,
}

impl WritableRegion {
    /// A zeroed region of `len` (> 0) bytes, whose memfd is labelled `label` (seen in
    /// /proc/<pid>/maps as `/memfd:<label>`). Its memory is reserved now: no memory is an
    /// error here, not a SIGBUS while writing.
    pub fn create(label: &str, len: usize) -> Result<WritableRegion, SharedError> {
        assert!(len > 0, "a region holds at least its header");
        let fd = rustix::fs::memfd_create(label, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| SharedError::os("memfd_create", e))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(|e| SharedError::os("ftruncate", e))?;
        match rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, len as u64) {
            Ok(()) => {}
            Err(Errno::NOSPC | Errno::NOMEM | Errno::FBIG) => {
                return Err(SharedError::NoMemory { requested: len })
            }
            Err(e) => return Err(SharedError::os("fallocate", e)),
        }
        let map = Mapping::new(fd.as_fd(), len, ProtFlags::READ | ProtFlags::WRITE)?;
        // Maps the pages in one call instead of one fault per page as they are written
        // (best effort: Linux 5.14+).
        // SAFETY: our mapping; populating changes no contents.
        let _ = unsafe { rustix::mm::madvise(map.ptr.as_ptr(), len, Advice::LinuxPopulateWrite) };
        Ok(WritableRegion { fd, map })
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: our writable mapping of `len` bytes, which no other process has seen yet;
        // borrowed through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr.as_ptr().cast(), self.map.len) }
    }

    /// Unmaps the writable mapping, seals the memfd and maps it read-only.
    pub fn seal(self) -> Result<SealedRegion, SharedError> {
        let WritableRegion { fd, map } = self;
        let len = map.len;
        drop(map); // F_SEAL_WRITE is refused while a writable shared mapping exists
        rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(|e| SharedError::os("F_ADD_SEALS", e))?;
        SealedRegion::map(fd, len)
    }
}

/// A sealed region, mapped read-only: what every process reads a container through.
pub struct SealedRegion {
    fd: OwnedFd,
    map: Mapping,
}

impl SealedRegion {
    fn map(fd: OwnedFd, len: usize) -> Result<SealedRegion, SharedError> {
        let map = Mapping::new(fd.as_fd(), len, ProtFlags::READ)?;
        Ok(SealedRegion { fd, map })
    }

    /// The region behind a descriptor another process sent: it must carry every seal (so its
    /// bytes and length stay as they are), then it is mapped read-only.
    pub fn from_fd(fd: OwnedFd) -> Result<SealedRegion, SharedError> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|_| {
            SharedError::Corrupt("the descriptor received is not a sealed memfd".into())
        })?;
        if !seals.contains(SEALS) {
            return Err(SharedError::Corrupt(format!(
                "the memfd received is not sealed against writes and resizing ({seals:?})"
            )));
        }
        let st = rustix::fs::fstat(&fd).map_err(|e| SharedError::os("fstat", e))?;
        let len = usize::try_from(st.st_size)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| SharedError::Corrupt("the memfd received is empty".into()))?;
        SealedRegion::map(fd, len)
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: a read-only mapping of a memfd sealed against writes and resizing: its
        // `len` bytes never change nor go away while the mapping (owned by self) lives.
        unsafe { std::slice::from_raw_parts(self.map.ptr.as_ptr().cast(), self.map.len) }
    }

    pub fn len(&self) -> usize {
        self.map.len
    }

    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// The memfd, to send to other processes.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(bytes: &[u8]) -> SealedRegion {
        let mut w = WritableRegion::create("rloader-shared:test", bytes.len()).unwrap();
        w.bytes_mut().copy_from_slice(bytes);
        w.seal().unwrap()
    }

    #[test]
    fn a_sealed_region_cannot_be_written_resized_or_unsealed() {
        let r = sealed(b"hello world");
        assert_eq!(r.bytes(), b"hello world");
        let fd = r.fd();
        assert_eq!(rustix::io::write(fd, b"x").unwrap_err(), Errno::PERM);
        assert_eq!(rustix::fs::ftruncate(fd, 1).unwrap_err(), Errno::PERM);
        assert_eq!(rustix::fs::ftruncate(fd, 1 << 20).unwrap_err(), Errno::PERM);
        assert_eq!(
            rustix::fs::fcntl_add_seals(fd, SealFlags::FUTURE_WRITE).unwrap_err(),
            Errno::PERM
        );
        // SAFETY: a mapping attempt that must fail; nothing is mapped.
        let writable = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                11,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        };
        assert_eq!(writable.unwrap_err(), Errno::PERM);
    }

    #[test]
    fn a_received_descriptor_must_be_sealed() {
        let r = sealed(&[1, 2, 3]);
        let again = SealedRegion::from_fd(r.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(again.bytes(), &[1, 2, 3]);
        // An unsealed memfd, and a descriptor that is no memfd at all, are refused.
        let open =
            rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&open, 4096).unwrap();
        assert!(matches!(
            SealedRegion::from_fd(open),
            Err(SharedError::Corrupt(_))
        ));
        let (a, _b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        assert!(matches!(
            SealedRegion::from_fd(a),
            Err(SharedError::Corrupt(_))
        ));
    }
}
