//! What can go wrong with a shared container.

use std::fmt;
use std::io;

use crate::hash::Name;

#[derive(Debug)]
pub enum SharedError {
    /// A system call failed.
    Os { op: &'static str, source: io::Error },
    /// No memory for a region of `requested` bytes (the machine's, or its cgroup's).
    NoMemory { requested: usize },
    /// Items a container cannot hold (a key given twice, a dtype that is not numeric).
    BadInput(String),
    /// Sizes past what the format or the address space holds.
    TooLarge(String),
    /// The items changed between the pass that counted them and the one that copied them.
    Changed,
    /// A region that is not a well-formed container.
    Corrupt(String),
    /// The container found under a name is not the one asked for (its content hash or kind).
    Mismatch(String),
    /// No process on this node serves the name.
    NotServed(Name),
    /// The process serving the name runs as another user.
    Untrusted { name: Name, uid: u32 },
}

impl SharedError {
    pub fn os(op: &'static str, e: impl Into<io::Error>) -> SharedError {
        SharedError::Os {
            op,
            source: e.into(),
        }
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedError::Os { op, source } => write!(f, "{op} failed: {source}"),
            SharedError::NoMemory { requested } => write!(
                f,
                "not enough memory for a shared container of {requested} bytes"
            ),
            SharedError::BadInput(m) | SharedError::Mismatch(m) => write!(f, "{m}"),
            SharedError::TooLarge(what) => write!(f, "{what} is too large"),
            SharedError::Changed => write!(
                f,
                "the items changed while the shared container was being built"
            ),
            SharedError::Corrupt(m) => write!(f, "malformed shared container: {m}"),
            SharedError::NotServed(name) => write!(
                f,
                "no process on this node holds the shared container {name} any more"
            ),
            SharedError::Untrusted { name, uid } => write!(
                f,
                "the shared container {name} is served by a process of user {uid}, not this one's"
            ),
        }
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SharedError::Os { source, .. } => Some(source),
            _ => None,
        }
    }
}
