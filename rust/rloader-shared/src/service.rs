//! Each process's part in keeping a container findable: one thread that serves the containers
//! this process serves, and watches the servers of the others it holds. It keeps sockets and
//! an epoll set, by name and memfd; which containers the process holds, and claiming a name,
//! are `container.rs`'s (`Registry`).
//!
//! NOTE [Serving a container]:
//! A container is found by its name (an abstract Unix socket address, `hash.rs`). At most one
//! socket holds a name at a time (the kernel makes `bind` atomic); the process that holds it
//! is the container's *server*. Its service thread accepts each connection, checks that the
//! peer runs as this user, and sends one message: the magic bytes and the sealed memfd
//! (SCM_RIGHTS). It keeps each accepted connection open until its peer closes it.
//!
//! Every other process holding the container keeps open the connection it received the memfd
//! through: it *watches* the server. When the server ends, however it ends (SIGKILL included:
//! the kernel closes its sockets), or drops the container, each watcher reads end-of-file, and
//! tries to bind the name: one wins and serves from then on; the others connect to it and watch
//! it. A connect that is refused after a lost bind (the winner has bound and not yet listened,
//! or has died meanwhile) is followed by another bind. So a name is served for as long as any
//! process that attached to the container or built it holds it.
//!
//! A builder binds the name *before* it builds (`Service::claim`): processes that connect
//! meanwhile wait in the listen backlog for their message, which comes once the region is
//! built and sealed (`Builder::serve`). If the builder fails or dies, they read end-of-file
//! and claim the name again: one of them builds. So when several ranks start at once, one
//! builds and the others wait for it; nobody builds a copy to throw away.
//!
//! Memory: the memfd lives while a process maps it or holds its descriptor. Every holder does
//! both (it may have to serve), nothing has a name in any file system, and a message in flight
//! dies with the socket that holds it: when the last holder ends, the kernel frees the memory.
//!
//! fork: a child inherits the mapping (and reads through it) but not the service thread. Its
//! copies of the sockets are closed at once (pthread_atfork, on the process's service): else a
//! child would keep a dead parent's listening socket, and with it the name, open, and nobody
//! would answer on it. A forked child neither serves nor watches what it inherited (its
//! parent does); it joins in for what it attaches to itself (by unpickling a handle).
//!
//! The state below is one mutex. No thread waits while holding it (the service thread waits in
//! `epoll_wait` without it); the atfork handlers take it around `fork`, so a child finds it
//! consistent. The `Registry` of the containers a process holds has a mutex of its own,
//! taken around `fork` the same way; neither is taken while the other is held.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Once, PoisonError};
use std::time::Duration;

use rustix::buffer::spare_capacity;
use rustix::event::epoll;
use rustix::io::Errno;
use rustix::net::SocketFlags;

use crate::hash::Name;
use crate::socket::{self, Received};
use crate::SharedError;

/// A process's service: the containers it serves or watches, and the thread that does it.
pub struct Service {
    state: Mutex<State>,
    uid: u32,
}

#[derive(Default)]
struct State {
    /// The epoll instance the thread waits on; None until the thread starts (and in a forked
    /// child, whose parent's thread it is).
    epoll: Option<Arc<OwnedFd>>,
    entries: HashMap<u64, Entry>,
    /// What each epoll token stands for: (entry, which of its sockets).
    tokens: HashMap<u64, (u64, Source)>,
    next_id: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Listener,
    Peer,
    Watch,
}

struct Entry {
    name: Name,
    /// This process's own descriptor of the memfd, to send.
    memfd: OwnedFd,
    role: Role,
}

enum Role {
    /// This process holds the name: its listening socket and the connections it accepted.
    Serving {
        listener: (u64, OwnedFd),
        peers: HashMap<u64, OwnedFd>,
    },
    /// Another process serves it: the connection to it.
    Watching { conn: (u64, OwnedFd) },
    /// Neither: the name is held by a socket of another user, or cannot be reached.
    Orphan,
}

/// Which role an entry starts in.
pub(crate) enum Start {
    Serve(OwnedFd),
    Watch(OwnedFd),
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

static GLOBAL: LazyLock<Service> = LazyLock::new(|| {
    static ATFORK: Once = Once::new();
    ATFORK.call_once(|| {
        // SAFETY: the handlers are `extern "C"` functions that live for the program; they only
        // lock, unlock and close descriptors (see NOTE above).
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_parent),
                Some(after_fork_child),
            )
        };
    });
    Service::new()
});

thread_local! {
    /// The global state's lock, held by the thread that forks from `before_fork` to the
    /// handler that runs after it.
    static HELD: RefCell<Option<MutexGuard<'static, State>>> = const { RefCell::new(None) };
}

extern "C" fn before_fork() {
    let guard = lock(&GLOBAL.state);
    HELD.with(|h| *h.borrow_mut() = Some(guard));
}

extern "C" fn after_fork_parent() {
    HELD.with(|h| drop(h.borrow_mut().take()));
}

extern "C" fn after_fork_child() {
    HELD.with(|h| {
        if let Some(mut state) = h.borrow_mut().take() {
            state.forget_sockets();
        }
    });
}

impl State {
    /// In a forked child: closes every socket inherited from the parent's service and forgets
    /// its thread, which does not run here (NOTE [Serving a container]).
    fn forget_sockets(&mut self) {
        self.entries.clear();
        self.tokens.clear();
        if let Some(epoll) = self.epoll.take() {
            let raw: RawFd = epoll.as_raw_fd();
            // The parent's thread holds the other reference, which never drops here: close the
            // descriptor by hand and leave the Arc be.
            std::mem::forget(epoll);
            // SAFETY: the child's copy of the epoll descriptor, closed once and never used again.
            unsafe { libc::close(raw) };
        }
    }

    fn token(&mut self, entry: u64, source: Source) -> u64 {
        self.next_id += 1;
        self.tokens.insert(self.next_id, (entry, source));
        self.next_id
    }
}

fn watch_flags() -> epoll::EventFlags {
    epoll::EventFlags::IN | epoll::EventFlags::RDHUP
}

impl Service {
    fn new() -> Service {
        Service {
            state: Mutex::new(State::default()),
            uid: rustix::process::getuid().as_raw(),
        }
    }

    /// This process's service (`Registry::global`'s).
    pub(crate) fn global() -> &'static Service {
        &GLOBAL
    }

    /// A service of its own, standing in for another process's in tests (`Registry::standalone`;
    /// it is never freed; fork does not know it).
    pub(crate) fn standalone() -> &'static Service {
        Box::leak(Box::new(Service::new()))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Serves or watches the container with `memfd` under `name`; returns the entry's id (for
    /// [`Service::remove`]).
    pub(crate) fn add(
        &'static self,
        name: &Name,
        memfd: BorrowedFd<'_>,
        start: Start,
    ) -> Result<u64, SharedError> {
        let memfd = memfd
            .try_clone_to_owned()
            .map_err(|e| SharedError::os("dup", e))?;
        let mut st = self.lock();
        let epoll = self.running(&mut st)?;
        st.next_id += 1;
        let id = st.next_id;
        let role = match start {
            Start::Serve(listener) => {
                let t = st.token(id, Source::Listener);
                epoll::add(
                    &*epoll,
                    &listener,
                    epoll::EventData::new_u64(t),
                    epoll::EventFlags::IN,
                )
                .map_err(|e| SharedError::os("epoll_ctl", e))?;
                Role::Serving {
                    listener: (t, listener),
                    peers: HashMap::new(),
                }
            }
            Start::Watch(conn) => {
                let t = st.token(id, Source::Watch);
                epoll::add(&*epoll, &conn, epoll::EventData::new_u64(t), watch_flags())
                    .map_err(|e| SharedError::os("epoll_ctl", e))?;
                Role::Watching { conn: (t, conn) }
            }
        };
        st.entries.insert(
            id,
            Entry {
                name: name.clone(),
                memfd,
                role,
            },
        );
        Ok(id)
    }

    /// Stops serving or watching entry `id`: its sockets close (a server's watchers take over).
    /// An unknown id (removed already, or inherited through fork) is nothing to do.
    pub(crate) fn remove(&self, id: u64) {
        let mut st = self.lock();
        if let Some(entry) = st.entries.remove(&id) {
            st.drop_role(entry.role);
        }
    }

    /// Whether this process serves (rather than watches) the container named `name` (tests).
    pub fn serves(&self, name: &Name) -> bool {
        let st = self.lock();
        st.entries
            .values()
            .any(|e| &e.name == name && matches!(e.role, Role::Serving { .. }))
    }

    /// The running thread's epoll instance, starting the thread the first time.
    fn running(&'static self, st: &mut State) -> Result<Arc<OwnedFd>, SharedError> {
        if let Some(e) = &st.epoll {
            return Ok(e.clone());
        }
        let epoll = Arc::new(
            epoll::create(epoll::CreateFlags::CLOEXEC)
                .map_err(|e| SharedError::os("epoll_create", e))?,
        );
        let theirs = epoll.clone();
        std::thread::Builder::new()
            .name("rloader-shared".into())
            .spawn(move || self.run(theirs))
            .map_err(|e| SharedError::os("spawning the rloader-shared thread", e))?;
        st.epoll = Some(epoll.clone());
        Ok(epoll)
    }

    /// The service thread: waits for events without the lock, handles them with it.
    fn run(&'static self, epoll: Arc<OwnedFd>) {
        let mut events = Vec::with_capacity(64);
        loop {
            events.clear();
            match epoll::wait(&*epoll, spare_capacity(&mut events), None) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(_) => return,
            }
            let mut st = self.lock();
            for ev in events.iter() {
                let (token, flags) = (ev.data.u64(), ev.flags);
                if let Some(&(id, source)) = st.tokens.get(&token) {
                    self.handle(&mut st, &epoll, id, source, token, flags);
                }
            }
        }
    }

    fn handle(
        &self,
        st: &mut State,
        epoll: &OwnedFd,
        id: u64,
        source: Source,
        token: u64,
        _flags: epoll::EventFlags,
    ) {
        match source {
            Source::Listener => self.accept(st, epoll, id),
            Source::Peer => {
                let Some(Entry {
                    role: Role::Serving { peers, .. },
                    ..
                }) = st.entries.get_mut(&id)
                else {
                    return;
                };
                let Some(conn) = peers.get(&token) else {
                    return;
                };
                if drained_to_end(conn.as_fd()) {
                    peers.remove(&token);
                    st.tokens.remove(&token);
                }
            }
            Source::Watch => {
                let Some(Entry {
                    role: Role::Watching { conn },
                    ..
                }) = st.entries.get(&id)
                else {
                    return;
                };
                if drained_to_end(conn.1.as_fd()) {
                    self.take_over(st, epoll, id);
                }
            }
        }
    }

    /// Accepts every pending connection to entry `id`'s listener and sends each the memfd.
    fn accept(&self, st: &mut State, epoll: &OwnedFd, id: u64) {
        loop {
            let Some(Entry {
                memfd,
                role: Role::Serving { listener, .. },
                ..
            }) = st.entries.get(&id)
            else {
                return;
            };
            let conn = match rustix::net::accept_with(
                &listener.1,
                SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            ) {
                Ok(c) => c,
                Err(Errno::INTR | Errno::CONNABORTED) => continue,
                Err(_) => return, // EAGAIN: none left (or the listener failed: its watchers cope)
            };
            let ours = socket::peer_uid(conn.as_fd()).is_ok_and(|u| u == self.uid);
            if !ours || socket::send_fd(conn.as_fd(), memfd.as_fd()).is_err() {
                continue; // closed: the peer reads end-of-file
            }
            let t = st.token(id, Source::Peer);
            if epoll::add(epoll, &conn, epoll::EventData::new_u64(t), watch_flags()).is_err() {
                st.tokens.remove(&t);
                continue;
            }
            if let Some(Entry {
                role: Role::Serving { peers, .. },
                ..
            }) = st.entries.get_mut(&id)
            {
                peers.insert(t, conn);
            }
        }
    }

    /// Entry `id`'s server is gone: serve the name, or watch whoever won it.
    fn take_over(&self, st: &mut State, epoll: &OwnedFd, id: u64) {
        let Some(entry) = st.entries.get_mut(&id) else {
            return;
        };
        let old = std::mem::replace(&mut entry.role, Role::Orphan);
        let name = entry.name.clone();
        st.drop_role(old);
        let role = match find_role(&name) {
            Some(Start::Serve(listener)) => {
                let t = st.token(id, Source::Listener);
                let _ = epoll::add(
                    epoll,
                    &listener,
                    epoll::EventData::new_u64(t),
                    epoll::EventFlags::IN,
                );
                Role::Serving {
                    listener: (t, listener),
                    peers: HashMap::new(),
                }
            }
            Some(Start::Watch(conn)) => {
                let t = st.token(id, Source::Watch);
                let _ = epoll::add(epoll, &conn, epoll::EventData::new_u64(t), watch_flags());
                Role::Watching { conn: (t, conn) }
            }
            None => Role::Orphan,
        };
        if let Some(entry) = st.entries.get_mut(&id) {
            entry.role = role;
        }
        // A listener that won the name may have connections waiting already.
        if matches!(
            st.entries.get(&id).map(|e| &e.role),
            Some(Role::Serving { .. })
        ) {
            self.accept(st, epoll, id);
        }
    }
}

impl State {
    /// Closes a role's sockets (closing takes them out of the epoll set too).
    fn drop_role(&mut self, role: Role) {
        match role {
            Role::Serving { listener, peers } => {
                self.tokens.remove(&listener.0);
                for t in peers.keys() {
                    self.tokens.remove(t);
                }
            }
            Role::Watching { conn } => {
                self.tokens.remove(&conn.0);
            }
            Role::Orphan => {}
        }
    }
}

/// Reads what `conn` has (descriptors sent with it are closed); true once the other end has
/// closed it.
fn drained_to_end(conn: BorrowedFd<'_>) -> bool {
    loop {
        match socket::recv(conn) {
            Ok(Received::Region(_) | Received::Other) => continue,
            Ok(Received::Nothing) => return false,
            Ok(Received::Closed) | Err(_) => return true,
        }
    }
}

/// Binds `name`, or connects to whoever holds it: the two steps of every claim of a name, with
/// their race (a name bound and not yet listening refuses connections) run to its end. None
/// when neither works (another user holds the name, or the race did not end: every try waits
/// longer, about 5 s in all).
pub(crate) fn find_role(name: &Name) -> Option<Start> {
    for attempt in 0..1000u32 {
        match socket::listen(name) {
            Ok(Some(listener)) => return Some(Start::Serve(listener)),
            Ok(None) => {}
            Err(_) => return None,
        }
        match socket::connect(name) {
            Ok(Some(conn)) => return Some(Start::Watch(conn)),
            Ok(None) => backoff(attempt),
            Err(_) => return None,
        }
    }
    None
}

/// Between two tries of a race another process is about to end (it has bound a name and is
/// about to listen): yield at first, then wait a little longer each time.
pub(crate) fn backoff(attempt: u32) {
    if attempt < 50 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(100 * u64::from(attempt.min(100))));
    }
}
