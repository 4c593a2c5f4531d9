//! A container as a process holds it, and how a process gets one: builds it, or attaches to
//! the copy another process serves (NOTE [Serving a container] in `service.rs`). The
//! [`Registry`] is a process's side of that: the containers it holds, by name, and its claims of
//! names; the `Service` beneath it only keeps their sockets (it knows no container).

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Once, PoisonError, Weak};
use std::time::Duration;

use crate::hash::Name;
use crate::layout::{Family, Header};
use crate::region::SealedRegion;
use crate::service::{self, Service, Start};
use crate::socket::{self, Received};
use crate::SharedError;

/// A container mapped in this process: its sealed region and parsed header, and its part in
/// the process's service (once it has a name).
pub struct Container {
    region: SealedRegion,
    header: Header,
    registry: &'static Registry,
    /// Its name, and its entry in the service while this process serves or watches it.
    named: Mutex<Option<(Name, Option<u64>)>>,
}

impl std::fmt::Debug for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Container")
            .field("header", &self.header)
            .field("name", &self.name())
            .finish()
    }
}

impl Container {
    fn new(region: SealedRegion, registry: &'static Registry) -> Result<Container, SharedError> {
        let header = Header::parse(region.bytes())?;
        Ok(Container {
            region,
            header,
            registry,
            named: Mutex::new(None),
        })
    }

    /// A container built in this process and found by no name yet: it gets one when first
    /// published ([`Container::publish`]).
    pub fn unnamed(
        region: SealedRegion,
        registry: &'static Registry,
    ) -> Result<Arc<Container>, SharedError> {
        Ok(Arc::new(Container::new(region, registry)?))
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The memfd's inode number: two processes that map the same container see the same one
    /// (tests compare it with /proc/<pid>/maps).
    #[allow(clippy::unnecessary_cast)] // st_ino is not u64 on every target
    pub fn inode(&self) -> u64 {
        rustix::fs::fstat(self.region.fd()).map_or(0, |st| st.st_ino as u64)
    }

    /// The whole region: header and sections.
    pub fn bytes(&self) -> &[u8] {
        self.region.bytes()
    }

    pub fn name(&self) -> Option<Name> {
        self.named
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(n, _)| n.clone())
    }

    /// The name other processes on this node find the container by. A container without one
    /// (built without a key) gets a fresh name and this process starts serving it.
    pub fn publish(self: &Arc<Self>, family: Family) -> Result<Name, SharedError> {
        let mut named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((name, _)) = &*named {
            return Ok(name.clone());
        }
        let (name, listener) = loop {
            let name = Name::anonymous(family)?;
            if let Some(l) = socket::listen(&name)? {
                break (name, l);
            }
        };
        let id = self
            .registry
            .service
            .add(&name, self.region.fd(), Start::Serve(listener))?;
        *named = Some((name.clone(), Some(id)));
        drop(named);
        self.registry.register(&name, self.clone());
        Ok(name)
    }

    fn set_name(&self, name: Name, entry: u64) {
        *self.named.lock().unwrap_or_else(PoisonError::into_inner) = Some((name, Some(entry)));
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let named = self
            .named
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some((name, entry)) = named {
            if let Some(id) = entry {
                self.registry.service.remove(id);
            }
            self.registry.unregister(&name);
        }
    }
}

/// What a process that looks for a container under a name is to do.
pub enum Claim {
    /// Nobody serves it: this process holds the name; build the region and serve it.
    Build(Builder),
    /// Another process serves it, or is building it: wait for its region.
    Wait(Waiting),
}

/// What an attached container must be.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    pub family: Family,
    /// Its content hash, where known (a handle carries it; a keyed build computed it).
    pub hash: Option<[u8; 16]>,
}

/// A process's containers: those it holds, by name (a second attach in the process maps
/// nothing new), and its claims of names, over the `Service` that keeps their sockets.
pub struct Registry {
    service: &'static Service,
    /// Locked only around reads and writes of the map (never while another lock is taken), and
    /// by the atfork handlers of the process's registry, so that a forked child finds it
    /// consistent (NOTE [Serving a container]).
    held: Mutex<Held>,
}

type Held = HashMap<Name, Weak<Container>>;

fn lock(m: &Mutex<Held>) -> MutexGuard<'_, Held> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

static GLOBAL: LazyLock<Registry> = LazyLock::new(|| {
    let service = Service::global(); // (its atfork handlers first: they run nested in these)
    static ATFORK: Once = Once::new();
    ATFORK.call_once(|| {
        // SAFETY: the handlers are `extern "C"` functions that live for the program; they only
        // lock and unlock the registry's mutex.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
    });
    Registry::new(service)
});

thread_local! {
    /// The process's registry's lock, held by the thread that forks from `before_fork` to the
    /// handler that runs after it.
    static HELD: RefCell<Option<MutexGuard<'static, Held>>> = const { RefCell::new(None) };
}

extern "C" fn before_fork() {
    let guard = lock(&GLOBAL.held);
    HELD.with(|h| *h.borrow_mut() = Some(guard));
}

extern "C" fn after_fork() {
    // In the child too: the containers it inherited stay mapped, and found by name.
    HELD.with(|h| drop(h.borrow_mut().take()));
}

impl Registry {
    fn new(service: &'static Service) -> Registry {
        Registry {
            service,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// This process's registry, over its service.
    pub fn global() -> &'static Registry {
        &GLOBAL
    }

    /// A registry and service of their own, standing in for another process's in tests (never
    /// freed; fork does not know them).
    pub fn standalone() -> &'static Registry {
        Box::leak(Box::new(Registry::new(Service::standalone())))
    }

    /// Whether this process serves (rather than watches) the container named `name` (tests).
    pub fn serves(&self, name: &Name) -> bool {
        self.service.serves(name)
    }

    /// The container this process holds under `name`, if any.
    pub fn local(&self, name: &Name) -> Option<Arc<Container>> {
        lock(&self.held).get(name).and_then(Weak::upgrade)
    }

    /// Records `container` as this process's under `name`, unless one is there already (two
    /// threads attached at once): then that one is returned.
    fn register(&self, name: &Name, container: Arc<Container>) -> Arc<Container> {
        let mut held = lock(&self.held);
        if let Some(existing) = held.get(name).and_then(Weak::upgrade) {
            if existing.header().hash == container.header().hash {
                return existing;
            }
        }
        held.insert(name.clone(), Arc::downgrade(&container));
        container
    }

    /// Forgets `name` if its container is gone (called as a container drops).
    fn unregister(&self, name: &Name) {
        let mut held = lock(&self.held);
        if held.get(name).is_some_and(|w| w.strong_count() == 0) {
            held.remove(name);
        }
    }

    /// Claims `name` (NOTE [Serving a container]): binds it if free, else connects to its
    /// server. Never waits for long (the race between a bind and its listen is short).
    pub fn claim(&'static self, name: &Name, expect: Expect) -> Result<Claim, SharedError> {
        for attempt in 0..1000u32 {
            if let Some(conn) = socket::connect(name)? {
                return Ok(Claim::Wait(self.waiting(name, conn, expect)));
            }
            if let Some(listener) = socket::listen(name)? {
                return Ok(Claim::Build(Builder {
                    registry: self,
                    name: name.clone(),
                    listener,
                }));
            }
            service::backoff(attempt);
        }
        Err(SharedError::os(
            "claiming a container's name",
            rustix::io::Errno::AGAIN,
        ))
    }

    /// Connects to the server of `name`, or None when no process serves it.
    pub fn connect(
        &'static self,
        name: &Name,
        expect: Expect,
    ) -> Result<Option<Waiting>, SharedError> {
        Ok(socket::connect(name)?.map(|conn| self.waiting(name, conn, expect)))
    }

    fn waiting(&'static self, name: &Name, conn: OwnedFd, expect: Expect) -> Waiting {
        Waiting {
            registry: self,
            name: name.clone(),
            conn: Some(conn),
            expect,
        }
    }
}

/// A claimed name, whose container this process is to build.
pub struct Builder {
    registry: &'static Registry,
    name: Name,
    listener: OwnedFd,
}

impl Builder {
    /// Serves the built `region` under the claimed name: the processes waiting get it now.
    pub fn serve(self, region: SealedRegion) -> Result<Arc<Container>, SharedError> {
        let container = Arc::new(Container::new(region, self.registry)?);
        let id = self.registry.service.add(
            &self.name,
            container.region.fd(),
            Start::Serve(self.listener),
        )?;
        container.set_name(self.name.clone(), id);
        Ok(self.registry.register(&self.name, container))
    }

    pub fn name(&self) -> &Name {
        &self.name
    }
}

/// The outcome of one wait for a server's message.
pub enum Polled {
    Ready(Arc<Container>),
    /// Nothing yet (the server is still building).
    Pending,
    /// The server closed the connection before sending (it failed or died): claim again.
    Closed,
}

/// A connection to a container's server, waiting for its region.
pub struct Waiting {
    registry: &'static Registry,
    name: Name,
    conn: Option<OwnedFd>,
    expect: Expect,
}

impl Waiting {
    /// Waits up to `timeout` for the region.
    pub fn poll(&mut self, timeout: Duration) -> Result<Polled, SharedError> {
        let Some(conn) = self.conn.as_ref() else {
            return Ok(Polled::Closed);
        };
        if !socket::readable(conn.as_fd(), timeout)? {
            return Ok(Polled::Pending);
        }
        let fd = match socket::recv(conn.as_fd())? {
            Received::Region(fd) => fd,
            Received::Nothing => return Ok(Polled::Pending),
            Received::Closed => {
                self.conn = None;
                return Ok(Polled::Closed);
            }
            Received::Other => {
                return Err(SharedError::Corrupt(format!(
                    "{} answered with something else than a container",
                    self.name
                )))
            }
        };
        let container = Container::new(SealedRegion::from_fd(fd)?, self.registry)?;
        let h = container.header();
        if h.kind.family() != self.expect.family {
            return Err(SharedError::Mismatch(format!(
                "{} holds a {}, not a {}",
                self.name,
                h.kind.family().label(),
                self.expect.family.label()
            )));
        }
        if let Some(want) = self.expect.hash {
            if h.hash != want {
                return Err(SharedError::Mismatch(format!(
                    "the container served under {} has content hash {}, not {}: it was built \
                     again from other items under the same key and version",
                    self.name,
                    hex(&h.hash),
                    hex(&want)
                )));
            }
        }
        if let Some(existing) = self.registry.local(&self.name) {
            if existing.header().hash == h.hash {
                return Ok(Polled::Ready(existing)); // another thread attached meanwhile
            }
        }
        let conn = self.conn.take().expect("checked above");
        let container = Arc::new(container);
        let id =
            self.registry
                .service
                .add(&self.name, container.region.fd(), Start::Watch(conn))?;
        container.set_name(self.name.clone(), id);
        Ok(Polled::Ready(self.registry.register(&self.name, container)))
    }
}

/// A content hash as text.
pub fn hex(hash: &[u8; 16]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}
