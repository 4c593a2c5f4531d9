//! Abstract Unix sockets: how a process finds the one serving a container, and how the memfd
//! crosses between them (SCM_RIGHTS).
//!
//! An abstract address has no file behind it: binding is atomic (one process holds a name at a
//! time), and the name is free again the moment the socket closes, however its process ended.
//! Abstract names belong to a network namespace: processes in one container (or on a host
//! without network namespaces) share them.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::hash::Name;
use crate::SharedError;

/// What a server sends with the memfd: the magic bytes and format version of the layout.
pub const HELLO: &[u8; 8] = b"RLSHARE\x01";

fn address(name: &Name) -> Result<SocketAddrUnix, SharedError> {
    SocketAddrUnix::new_abstract_name(name.as_bytes())
        .map_err(|e| SharedError::os("socket address", e))
}

fn stream() -> Result<OwnedFd, SharedError> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| SharedError::os("socket", e))
}

/// A socket listening on `name`, or None when another socket holds the name.
pub fn listen(name: &Name) -> Result<Option<OwnedFd>, SharedError> {
    let fd = stream()?;
    match rustix::net::bind(&fd, &address(name)?) {
        Ok(()) => {}
        Err(Errno::ADDRINUSE) => return Ok(None),
        Err(e) => return Err(SharedError::os("bind", e)),
    }
    // The kernel caps the backlog at net.core.somaxconn (4096 by default): processes that
    // connect while the container is being built wait there.
    rustix::net::listen(&fd, 4096).map_err(|e| SharedError::os("listen", e))?;
    rustix::io::ioctl_fionbio(&fd, true).map_err(|e| SharedError::os("FIONBIO", e))?;
    Ok(Some(fd))
}

/// A connection to the socket listening on `name`, or None when none listens (nobody holds the
/// name, or its holder has bound it and not yet listened). The connection is refused unless
/// the listening process runs as this user.
pub fn connect(name: &Name) -> Result<Option<OwnedFd>, SharedError> {
    let fd = stream()?;
    let addr = address(name)?;
    loop {
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => break,
            Err(Errno::INTR) => continue,
            Err(Errno::CONNREFUSED | Errno::NOENT) => return Ok(None),
            Err(e) => return Err(SharedError::os("connect", e)),
        }
    }
    let uid = peer_uid(fd.as_fd())?;
    if uid != rustix::process::getuid().as_raw() {
        return Err(SharedError::Untrusted {
            name: name.clone(),
            uid,
        });
    }
    Ok(Some(fd))
}

/// The user id of the process at the other end of `conn`.
pub fn peer_uid(conn: BorrowedFd<'_>) -> Result<u32, SharedError> {
    let cred = rustix::net::sockopt::socket_peercred(conn)
        .map_err(|e| SharedError::os("SO_PEERCRED", e))?;
    Ok(cred.uid.as_raw())
}

/// Sends [`HELLO`] and `memfd` on `conn`, without waiting (a fresh connection has room).
pub fn send_fd(conn: BorrowedFd<'_>, memfd: BorrowedFd<'_>) -> Result<(), SharedError> {
    let fds = [memfd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    let sent = rustix::net::sendmsg(
        conn,
        &[IoSlice::new(HELLO)],
        &mut control,
        SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
    )
    .map_err(|e| SharedError::os("sendmsg", e))?;
    if sent != HELLO.len() {
        return Err(SharedError::os("sendmsg", Errno::AGAIN));
    }
    Ok(())
}

/// What reading a connection found.
#[derive(Debug)]
pub enum Received {
    /// A server's message: [`HELLO`] and the memfd.
    Region(OwnedFd),
    /// Bytes that are no server's message (any descriptor sent with them is closed).
    Other,
    /// Nothing yet.
    Nothing,
    /// The other end closed the connection.
    Closed,
}

/// Reads what `conn` has, without waiting.
pub fn recv(conn: BorrowedFd<'_>) -> Result<Received, SharedError> {
    let mut buf = [0u8; HELLO.len()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match rustix::net::recvmsg(
            conn,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(msg) => break msg.bytes,
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(Received::Nothing),
            Err(Errno::CONNRESET) => return Ok(Received::Closed),
            Err(e) => return Err(SharedError::os("recvmsg", e)),
        }
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    if got == 0 {
        return Ok(Received::Closed);
    }
    if got == HELLO.len() && buf == *HELLO && fds.len() == 1 {
        return Ok(Received::Region(fds.pop().expect("one descriptor")));
    }
    Ok(Received::Other)
}

/// Waits up to `timeout` for `conn` to have something to read; true when it has.
pub fn readable(conn: BorrowedFd<'_>, timeout: Duration) -> Result<bool, SharedError> {
    let ts = rustix::event::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    let mut fds = [PollFd::new(&conn, PollFlags::IN)];
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(n) => Ok(n > 0),
        Err(Errno::INTR) => Ok(false),
        Err(e) => Err(SharedError::os("poll", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Family;

    fn fresh() -> Name {
        Name::anonymous(Family::List).unwrap()
    }

    #[test]
    fn a_name_is_held_by_one_socket_at_a_time() {
        let name = fresh();
        assert!(connect(&name).unwrap().is_none(), "nobody listens yet");
        let first = listen(&name).unwrap().expect("a fresh name binds");
        assert!(listen(&name).unwrap().is_none(), "the name is taken");
        assert!(connect(&name).unwrap().is_some());
        drop(first);
        // The name is free again as soon as its socket is closed.
        assert!(connect(&name).unwrap().is_none());
        assert!(listen(&name).unwrap().is_some());
    }

    #[test]
    fn a_memfd_crosses_a_connection() {
        let name = fresh();
        let server = listen(&name).unwrap().unwrap();
        let client = connect(&name).unwrap().unwrap();
        assert!(matches!(recv(client.as_fd()).unwrap(), Received::Nothing));
        let conn = rustix::net::accept(&server).unwrap();
        let memfd = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&memfd, 12345).unwrap();
        send_fd(conn.as_fd(), memfd.as_fd()).unwrap();
        assert!(readable(client.as_fd(), Duration::from_secs(10)).unwrap());
        match recv(client.as_fd()).unwrap() {
            Received::Region(fd) => {
                let a = rustix::fs::fstat(&fd).unwrap();
                let b = rustix::fs::fstat(&memfd).unwrap();
                assert_eq!((a.st_ino, a.st_size), (b.st_ino, 12345));
            }
            other => panic!("{other:?}"),
        }
        drop(conn);
        assert!(matches!(recv(client.as_fd()).unwrap(), Received::Closed));
        // Bytes that are not a server's message are not taken for one.
        let client = connect(&name).unwrap().unwrap();
        let conn = rustix::net::accept(&server).unwrap();
        rustix::io::write(&conn, b"RLSHARE\x01").unwrap();
        assert!(readable(client.as_fd(), Duration::from_secs(10)).unwrap());
        assert!(matches!(recv(client.as_fd()).unwrap(), Received::Other));
    }
}
