//! A worker watching the process that owns its loader, so that it never outlives it.
//!
//! Started by fork or spawn, the main process is the worker's parent: the kernel kills the
//! worker when it dies (Linux's parent-death signal), and [`MainProcess::gone`] notices that
//! its parent changed. Started by a forkserver, the parent is the server: `gone` asks after the
//! main process's pid instead, and a main process that died but was not reaped yet (a zombie)
//! counts as gone.

/// The process that owns a worker's loader, watched from the worker.
#[derive(Debug)]
pub struct MainProcess {
    pid: i32,
    is_parent: bool,
}

impl MainProcess {
    /// Watches `pid`. When it is this process's parent, also asks the kernel (Linux) to kill
    /// this process when the parent dies: call it only in a worker process.
    pub fn new(pid: i32) -> MainProcess {
        // SAFETY: getppid has no preconditions.
        let is_parent = unsafe { libc::getppid() } == pid;
        #[cfg(target_os = "linux")]
        if is_parent {
            // SAFETY: sets this process's parent-death signal; no memory is involved.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        }
        MainProcess { pid, is_parent }
    }

    /// Whether the main process has ended.
    pub fn gone(&self) -> bool {
        if self.is_parent {
            // SAFETY: getppid has no preconditions.
            return unsafe { libc::getppid() } != self.pid;
        }
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(self.pid, 0) != 0 && *libc::__errno_location() == libc::ESRCH } {
            return true;
        }
        // A main process that died but is not reaped yet (its parent is busy) is a zombie,
        // which kill(0) still finds.
        is_zombie(self.pid)
    }
}

/// Whether `pid` is a zombie (Linux: state Z, or X, in /proc/<pid>/stat).
pub fn is_zombie(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => zombie_state(&stat),
        Err(_) => false,
    }
}

/// Whether a /proc/<pid>/stat line reads dead or zombie.
fn zombie_state(stat: &str) -> bool {
    // The state follows the command name, which is in parentheses and may hold anything.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "Z" || state == "X")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn pid() -> i32 {
        std::process::id() as i32
    }

    /// Forks a child that runs `child` and `_exit`s with its code; returns its pid.
    fn fork(child: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child runs `child` (system calls and a little allocation) and leaves with
        // _exit, running no destructor or atexit handler of the parent's state.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(99);
            // SAFETY: ends the child without touching the parent's state.
            unsafe { libc::_exit(code) };
        }
        pid
    }

    /// Reaps `pid` and returns its raw wait status.
    fn reap(pid: i32) -> i32 {
        let mut status = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn stat_lines_are_read_past_the_command_name() {
        assert!(zombie_state("42 (python) Z 1 42 42 0"));
        assert!(zombie_state("42 (a) b) X 1"));
        assert!(!zombie_state("42 (wor) Z ker) S 1 42"));
        assert!(!zombie_state("42 (python) R 1"));
        assert!(!zombie_state("garbage"));
        assert!(!zombie_state(""));
    }

    #[test]
    fn a_live_process_is_not_gone() {
        // Not our parent: watched by pid (and no parent-death signal is set on the test).
        assert!(!MainProcess::new(pid()).gone());
        assert!(!is_zombie(pid()));
    }

    #[test]
    fn a_reaped_process_is_gone() {
        let child = fork(|| 0);
        reap(child);
        assert!(!is_zombie(child));
        assert!(MainProcess::new(child).gone());
    }

    #[test]
    fn a_dead_unreaped_process_is_gone() {
        let child = fork(|| 0);
        eventually("the child becomes a zombie", || is_zombie(child));
        assert!(MainProcess::new(child).gone());
        reap(child);
    }

    #[test]
    fn a_worker_sees_its_live_parent() {
        let parent = pid();
        let child = fork(move || {
            let main = MainProcess::new(parent);
            i32::from(!main.is_parent || main.gone())
        });
        let status = reap(child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }

    /// A worker whose main process (its parent) dies is killed by the kernel; were it not, it
    /// would see that its parent changed. The test process adopts the orphaned worker
    /// (PR_SET_CHILD_SUBREAPER) to learn how it ended.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_worker_does_not_outlive_its_parent() {
        // SAFETY: only changes who reaps this process's orphaned descendants.
        assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
        let mut fds = [0; 2];
        // SAFETY: a pipe into a buffer of two descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let [read_end, write_end] = fds;
        let main = fork(move || {
            let main_pid = std::process::id() as i32;
            let worker = fork(move || {
                let watch = MainProcess::new(main_pid);
                let t = Instant::now();
                while !watch.gone() && t.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                7 // only if the parent-death signal did not come
            });
            // SAFETY: writes the worker's pid into the pipe.
            let n = unsafe { libc::write(write_end, (&worker as *const i32).cast(), 4) };
            // Give the worker time to set its parent-death signal, then die.
            std::thread::sleep(Duration::from_millis(200));
            i32::from(n != 4)
        });
        let mut worker = 0i32;
        // SAFETY: reads the worker's pid from the pipe.
        let n = unsafe { libc::read(read_end, (&mut worker as *mut i32).cast(), 4) };
        assert_eq!(n, 4);
        // SAFETY: our descriptors.
        unsafe {
            libc::close(read_end);
            libc::close(write_end);
        }
        assert_eq!(reap(main), 0);
        let status = reap(worker);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL,
            "the worker outlived its parent: status {status:#x}"
        );
    }
}
