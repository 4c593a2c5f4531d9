//! Two processes: the parent creates an anonymous region, a forked child maps it anew
//! through a descriptor of its own (as a spawned worker maps the one multiprocessing passes
//! it), and they talk through rings.
#![cfg(not(loom))]

use std::sync::Arc;
use std::time::Duration;

use rloader_queue::{Doorbell, QueueError, Ring, ShmRegion};

const CAPACITY: usize = 16 << 10;
const TIMEOUT: Option<Duration> = Some(Duration::from_secs(30));

fn ring_len() -> usize {
    Ring::required_len(CAPACITY)
}

/// Runs `child` in a forked process that exits with 0 if it returned Ok, 1 otherwise
/// (never unwinding into the test harness's copy), and returns its pid.
fn fork(child: impl FnOnce() -> Result<(), QueueError>) -> libc::pid_t {
    // SAFETY: the child only runs `child` (which opens shared memory and uses rings) and
    // leaves with _exit, running no destructor or atexit handler of the parent's state.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child))
            .map(|r| r.is_ok())
            .unwrap_or(false);
        // SAFETY: ends the child without touching the parent's state.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    pid
}

fn wait_for(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: our own child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: status {status:#x}"
    );
}

fn message(k: u32) -> Vec<u8> {
    let len = (k as usize * 977) % (3 * CAPACITY); // some streamed
    (0..len).map(|i| (k as usize + i) as u8).collect()
}

/// The child's own mapping of `region`, through a duplicate of its descriptor (not the
/// parent's mapping, which the fork copied).
fn remap(region: &ShmRegion) -> Result<Arc<ShmRegion>, QueueError> {
    // SAFETY: dup gives a descriptor that the new handle then owns alone.
    let fd = unsafe { libc::dup(region.fd()) };
    // SAFETY: as above.
    Ok(Arc::new(unsafe { ShmRegion::from_fd(fd, "xproc child") }?))
}

#[test]
fn forked_child_maps_the_descriptor_and_sends() {
    const N: u32 = 2000;
    let len = Doorbell::LEN + ring_len();
    let region = Arc::new(ShmRegion::create_anonymous("xproc", len, len).unwrap());
    let rx = Ring::init(Arc::clone(&region), Doorbell::LEN, ring_len()).unwrap();
    let bell = Doorbell::init(Arc::clone(&region), 0);
    let seen = bell.current();

    let pid = fork(|| {
        let region = remap(&region)?;
        let bell = Doorbell::attach(Arc::clone(&region), 0);
        let tx = Ring::attach(region, Doorbell::LEN, ring_len())?.with_doorbell(bell);
        for k in 0..N {
            tx.send(&[&message(k)], TIMEOUT)?;
        }
        tx.close();
        Ok(())
    });

    assert!(
        bell.wait(seen, Duration::from_secs(30)),
        "the child never rang"
    );
    let mut out = Vec::new();
    for k in 0..N {
        rx.recv(&mut out, TIMEOUT).unwrap();
        assert!(out == message(k), "message {k}");
    }
    assert!(matches!(
        rx.recv(&mut out, TIMEOUT),
        Err(QueueError::Closed)
    ));
    wait_for(pid);
}

#[test]
fn forked_child_echoes_through_a_ring_each_way() {
    let len = 2 * ring_len();
    let region = Arc::new(ShmRegion::create_anonymous("xproc-echo", len, len).unwrap());
    let to_child = Ring::init(Arc::clone(&region), 0, ring_len()).unwrap();
    let from_child = Ring::init(Arc::clone(&region), ring_len(), ring_len()).unwrap();

    let pid = fork(|| {
        let region = remap(&region)?;
        let rx = Ring::attach(Arc::clone(&region), 0, ring_len())?;
        let tx = Ring::attach(region, ring_len(), ring_len())?;
        tx.send(&[b"opened"], TIMEOUT)?;
        // Echo until the parent closes.
        let mut msg = Vec::new();
        loop {
            match rx.recv(&mut msg, TIMEOUT) {
                Ok(()) => tx.send(&[b"echo:", &msg], TIMEOUT)?,
                Err(QueueError::Closed) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });

    let mut out = Vec::new();
    from_child.recv(&mut out, TIMEOUT).unwrap();
    assert_eq!(out, b"opened");
    for k in 0..100u32 {
        let msg = message(k);
        to_child.send(&[&msg], TIMEOUT).unwrap();
        from_child.recv(&mut out, TIMEOUT).unwrap();
        assert_eq!(&out[..5], b"echo:");
        assert!(out[5..] == msg[..], "echo {k}");
    }
    to_child.close();
    wait_for(pid);
}
