//! fork and the process's own service (NOTE [Serving a container]), in a test binary of its
//! own: a fork copies every descriptor of the process, and in `serving.rs` the other tests'
//! stand-in services (which no atfork handler knows) would lend the child their sockets.

mod common;

use common::{build, fresh_name, items, ANY};
use rloader_shared::Registry;

/// A forked child keeps the mapping but closes its copies of the service's sockets: when the
/// parent drops the container the name is free, though the child still lives.
#[test]
fn a_forked_child_does_not_hold_the_name() {
    let s = Registry::global();
    let name = fresh_name("fork");
    let built = build(s, &name, &[b"inherited"]);
    let (mut wake, mut ready) = ([0i32; 2], [0i32; 2]);
    // SAFETY: two pipes: the child says it runs, the parent says it may end.
    assert_eq!(
        unsafe { libc::pipe(wake.as_mut_ptr()) + libc::pipe(ready.as_mut_ptr()) },
        0
    );
    // SAFETY: the child only reads the inherited mapping, uses the pipes and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // The atfork handler has run by now (it runs before fork returns here).
        let ok = items(&built) == vec![b"inherited".to_vec()];
        let mut byte = 0u8;
        // SAFETY: the child's ends of the pipes; then exit without running the test harness.
        unsafe {
            libc::close(wake[1]);
            libc::write(ready[1], b"r".as_ptr().cast(), 1);
            libc::read(wake[0], (&mut byte as *mut u8).cast(), 1);
            libc::_exit(if ok { 0 } else { 1 });
        }
    }
    let mut byte = 0u8;
    // SAFETY: the parent's end of `ready`: returns once the child runs.
    assert_eq!(
        unsafe { libc::read(ready[0], (&mut byte as *mut u8).cast(), 1) },
        1
    );
    drop(built);
    let after = Registry::standalone()
        .connect(&name, ANY)
        .map(|w| w.is_some());
    let mut status = 0;
    // SAFETY: wakes the child and reaps it.
    unsafe {
        libc::write(wake[1], b"x".as_ptr().cast(), 1);
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
    }
    assert!(
        matches!(after, Ok(false)),
        "the child kept the name bound: {after:?}"
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{status}"
    );
}
