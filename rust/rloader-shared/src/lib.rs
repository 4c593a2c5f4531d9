//! Read-only containers whose data lives once in shared memory per node, whatever process
//! uses them: the Rust side of `rloader.shared` (the Python classes are thin bindings in
//! rloader-py's `shared/`).
//!
//! - `layout.rs`: a region's header and sections; `list.rs`, `array.rs`, `map.rs`: what each
//!   kind of container keeps there, its writer and its (bounds-checked) view;
//! - `hash.rs`: the content hash, and the names containers are found by;
//! - `region.rs`: the memory: a memfd, written once, sealed, mapped read-only everywhere;
//! - `socket.rs`: abstract Unix sockets, and the memfd crossing them (SCM_RIGHTS);
//! - `service.rs`: each process's thread that serves its containers' sockets, or watches their
//!   server to take over when it ends (NOTE [Serving a container]); it knows no container;
//! - `container.rs`: a container as a process holds it, and the `Registry` of a process's
//!   containers: claiming a name, building, attaching (it uses `service.rs`, not the reverse).
//!
//! Nothing here knows Python: building reads items the binding hands over, reading returns
//! bytes and numbers.

mod array;
mod container;
mod error;
mod hash;
pub mod layout;
mod list;
mod map;
mod region;
mod service;
pub mod socket;

pub use array::{array_layout, itemsize, write_meta, ArrayView};
pub use container::{hex, Builder, Claim, Container, Expect, Polled, Registry, Waiting};
pub use error::SharedError;
pub use hash::{readable, ContentHasher, Ident, Name};
pub use layout::{Family, Header, Kind};
pub use list::{list_layout, prefetch_item, ListPlanner, ListView, ListWriter};
pub use map::{map_layout, MapView, MapWriter};
pub use region::{SealedRegion, WritableRegion};
