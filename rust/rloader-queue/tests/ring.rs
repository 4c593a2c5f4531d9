//! Ring semantics, one behaviour per test: framing, wrap-around, exact fit, empty and
//! streamed messages, close, timeouts, and a peer's garbage.
#![cfg(not(loom))]

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rloader_queue::{QueueError, Ring, ShmRegion};

const HEADER: usize = 8;
const SHORT: Option<Duration> = Some(Duration::from_millis(20));
const LONG: Option<Duration> = Some(Duration::from_secs(20));

fn ring(capacity: usize) -> Ring {
    let len = Ring::required_len(capacity);
    let region = Arc::new(ShmRegion::create_anonymous("ring-test", len, len).unwrap());
    Ring::init(region, 0, len).unwrap()
}

/// A second handle on the same ring, as the peer process would attach it.
fn peer(r: &Ring) -> Ring {
    let len = Ring::required_len(r.capacity());
    Ring::attach(Arc::clone(r.region()), r.offset(), len).unwrap()
}

fn recv(r: &Ring) -> Vec<u8> {
    let mut out = Vec::new();
    r.recv(&mut out, LONG).unwrap();
    out
}

#[test]
fn parts_are_concatenated_into_one_message() {
    let r = ring(256);
    r.send(&[b"head", b"", b"er", b"-payload"], None).unwrap();
    r.send(&[b"second"], None).unwrap();
    let p = peer(&r);
    assert_eq!(recv(&p), b"header-payload");
    assert_eq!(recv(&p), b"second");
    assert!(!p.try_recv(&mut Vec::new()).unwrap());
}

#[test]
fn zero_length_messages() {
    let r = ring(64);
    for _ in 0..100 {
        r.send(&[], None).unwrap();
        r.send(&[b""], None).unwrap();
        assert!(r.has_message());
        assert_eq!(recv(&r), b"");
        assert_eq!(recv(&r), b"");
    }
    assert!(!r.has_message());
}

#[test]
fn wraparound_keeps_content_and_order() {
    let r = ring(100);
    let mut n = 0u8;
    for round in 0..2000usize {
        let len = (round * 7) % 60;
        let msg: Vec<u8> = (0..len).map(|i| n.wrapping_add(i as u8)).collect();
        r.send(&[&msg], SHORT).unwrap();
        assert_eq!(recv(&r), msg, "round {round}");
        n = n.wrapping_add(1);
    }
}

#[test]
fn exact_fit_fills_the_ring_then_the_next_send_times_out() {
    let r = ring(64);
    // Move the positions so the exact-fit frame also wraps.
    r.send(&[&[1; 13]], None).unwrap();
    assert_eq!(recv(&r), [1; 13]);
    let fits = vec![2u8; 64 - HEADER];
    r.send(&[&fits], SHORT).unwrap();
    let t = Instant::now();
    assert!(matches!(r.send(&[], SHORT), Err(QueueError::Timeout)));
    assert!(t.elapsed() >= Duration::from_millis(20));
    // A timed-out send of a message that fits leaves nothing behind and the ring usable.
    assert!(!r.is_closed());
    assert_eq!(recv(&r), fits);
    assert!(!r.has_message());
    r.send(&[b"after"], SHORT).unwrap();
    assert_eq!(recv(&r), b"after");
}

#[test]
fn frames_summing_to_the_capacity_fit_without_a_reader() {
    let r = ring(64);
    let (a, b) = (
        vec![3u8; 20],
        vec![4u8; 64 - Ring::frame_len(20) - Ring::frame_len(0)],
    );
    assert_eq!(
        Ring::frame_len(a.len()) + Ring::frame_len(b.len()),
        r.capacity()
    );
    r.send(&[&a], Some(Duration::ZERO)).unwrap();
    r.send(&[&b], Some(Duration::ZERO)).unwrap();
    assert!(matches!(
        r.send(&[], Some(Duration::ZERO)),
        Err(QueueError::Timeout)
    ));
    assert_eq!(recv(&r), a);
    assert_eq!(recv(&r), b);
}

#[test]
fn recv_times_out_on_an_empty_ring() {
    let r = ring(64);
    let t = Instant::now();
    let mut out = vec![1, 2, 3];
    assert!(matches!(r.recv(&mut out, SHORT), Err(QueueError::Timeout)));
    assert!(t.elapsed() >= Duration::from_millis(20));
    assert!(out.is_empty());
    assert!(!r.try_recv(&mut out).unwrap());
}

#[test]
fn message_larger_than_the_ring_is_streamed() {
    let r = Arc::new(ring(4096));
    let big: Vec<u8> = (0..1_000_003u32).map(|i| (i % 251) as u8).collect();
    let sender = {
        let r = Arc::clone(&r);
        let big = big.clone();
        thread::spawn(move || {
            r.send(&[b"x", &big, b"y"], LONG).unwrap();
            r.send(&[b"small"], LONG).unwrap();
        })
    };
    let got = recv(&r);
    assert_eq!(got.len(), big.len() + 2);
    assert_eq!(got[0], b'x');
    assert_eq!(&got[1..got.len() - 1], &big[..]);
    assert_eq!(got[got.len() - 1], b'y');
    assert_eq!(recv(&r), b"small");
    sender.join().unwrap();
}

#[test]
fn recv_timeouts_in_the_middle_of_a_streamed_message_lose_nothing() {
    let r = Arc::new(ring(64));
    // 300 ring-fulls: a sender keeping pace with every zero-timeout call, so that the whole
    // message arrives in one, is out of reach even on an idle machine.
    let big: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
    let sender = {
        let r = Arc::clone(&r);
        let big = big.clone();
        thread::spawn(move || r.send(&[&big], LONG).unwrap())
    };
    let mut out = Vec::new();
    let mut timeouts = 0;
    loop {
        // Let the sender fill the ring, then take what is there without waiting: each
        // call ends with a timeout in the middle of the message.
        thread::sleep(Duration::from_micros(200));
        match r.recv(&mut out, Some(Duration::ZERO)) {
            Ok(()) => break,
            Err(QueueError::Timeout) => {
                assert!(out.is_empty());
                timeouts += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(out, big);
    assert!(
        timeouts >= 1,
        "{timeouts} timeouts: the test did not time out mid-message"
    );
    sender.join().unwrap();
}

#[test]
fn try_recv_assembles_a_streamed_message_across_calls() {
    let r = Arc::new(ring(256));
    let big = vec![9u8; 10_000];
    let sender = {
        let r = Arc::clone(&r);
        let big = big.clone();
        thread::spawn(move || r.send(&[&big], LONG).unwrap())
    };
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !r.try_recv(&mut out).unwrap() {
        assert!(Instant::now() < deadline);
        thread::yield_now();
    }
    assert_eq!(out, big);
    sender.join().unwrap();
}

#[test]
fn close_drains_then_reports_closed() {
    let r = ring(256);
    r.send(&[b"one"], None).unwrap();
    r.send(&[b"two"], None).unwrap();
    let p = peer(&r);
    p.close(); // either side may close
    assert!(r.is_closed() && p.is_closed());
    assert!(matches!(r.send(&[b"three"], None), Err(QueueError::Closed)));
    assert_eq!(recv(&p), b"one");
    let mut out = Vec::new();
    assert!(p.try_recv(&mut out).unwrap());
    assert_eq!(out, b"two");
    assert!(matches!(p.recv(&mut out, None), Err(QueueError::Closed)));
    assert!(matches!(p.try_recv(&mut out), Err(QueueError::Closed)));
}

#[test]
fn close_wakes_a_blocked_receiver() {
    let r = Arc::new(ring(256));
    let receiver = {
        let r = Arc::clone(&r);
        thread::spawn(move || r.recv(&mut Vec::new(), None))
    };
    thread::sleep(Duration::from_millis(20));
    r.close();
    assert!(matches!(receiver.join().unwrap(), Err(QueueError::Closed)));
}

#[test]
fn close_wakes_a_blocked_sender() {
    let r = Arc::new(ring(64));
    r.send(&[&[0; 56]], None).unwrap(); // full
    let sender = {
        let r = Arc::clone(&r);
        thread::spawn(move || r.send(&[b"more"], None))
    };
    thread::sleep(Duration::from_millis(20));
    r.close();
    assert!(matches!(sender.join().unwrap(), Err(QueueError::Closed)));
}

#[test]
fn send_timeout_in_the_middle_of_a_streamed_message_closes_the_ring() {
    let r = ring(64);
    let big = vec![1u8; 1000];
    assert!(matches!(r.send(&[&big], SHORT), Err(QueueError::Timeout)));
    assert!(r.is_closed());
    let mut out = Vec::new();
    assert!(matches!(r.recv(&mut out, None), Err(QueueError::Closed)));
}

#[test]
fn attach_checks_the_header() {
    let len = Ring::required_len(1024);
    let region = Arc::new(ShmRegion::create_anonymous("attach", 2 * len, 2 * len).unwrap());
    let err = Ring::attach(Arc::clone(&region), 0, len).err().unwrap();
    assert!(matches!(err, QueueError::BadHeader(_)), "{err}");
    assert!(
        err.to_string()
            .contains("wrong shared-memory name or offset"),
        "{err}"
    );

    Ring::init(Arc::clone(&region), 0, len).unwrap();
    let err = Ring::attach(Arc::clone(&region), 0, len - 64)
        .err()
        .unwrap();
    assert!(err.to_string().contains("attached with room for"), "{err}");
    let err = Ring::attach(Arc::clone(&region), 64, len).err().unwrap();
    assert!(matches!(err, QueueError::BadHeader(_)), "{err}");
    let err = Ring::attach(Arc::clone(&region), 8, len).err().unwrap();
    assert!(matches!(err, QueueError::Misaligned { .. }), "{err}");
    let err = Ring::init(Arc::clone(&region), 0, 100).err().unwrap();
    assert!(matches!(err, QueueError::TooSmall { .. }), "{err}");
    let err = Ring::init(Arc::clone(&region), len, 2 * len).err().unwrap();
    assert!(matches!(err, QueueError::TooSmall { .. }), "{err}");

    // Two rings side by side in one region stay independent.
    let a = Ring::init(Arc::clone(&region), 0, len).unwrap();
    let b = Ring::init(Arc::clone(&region), len, len).unwrap();
    a.send(&[b"a"], None).unwrap();
    b.send(&[b"b"], None).unwrap();
    assert_eq!(recv(&b), b"b");
    assert_eq!(recv(&a), b"a");
}

/// Writes `bytes` at `at` bytes into the region, as a misbehaving peer would.
fn scribble(r: &Ring, at: usize, bytes: &[u8]) {
    // SAFETY: inside the region; the test's own threads are not using the ring now.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), r.region().as_ptr().add(at), bytes.len())
    };
}

const DATA: usize = Ring::required_len(0);
const TAIL: usize = 64;

#[test]
fn garbage_frame_header_is_an_error_not_a_panic() {
    let r = ring(256);
    r.send(&[b"hello"], None).unwrap();
    scribble(&r, DATA, &u64::MAX.to_le_bytes());
    let err = r.recv(&mut Vec::new(), None).unwrap_err();
    assert!(matches!(err, QueueError::Corrupt(_)), "{err}");
}

#[test]
fn garbage_length_with_a_valid_tag_does_not_allocate_it() {
    let r = ring(256);
    r.send(&[b"hello"], None).unwrap();
    // The tag is right, the length says 256 TiB: recv must wait for bytes, not reserve them.
    scribble(&r, DATA, &(0x5251u64 << 48 | ((1 << 48) - 1)).to_le_bytes());
    let mut out = Vec::new();
    assert!(matches!(r.recv(&mut out, SHORT), Err(QueueError::Timeout)));
    assert!(out.capacity() < 1 << 20);
}

#[test]
fn garbage_writer_position_is_an_error_not_a_panic() {
    let r = ring(256);
    r.send(&[b"hello"], None).unwrap();
    scribble(&r, TAIL, &u64::MAX.to_le_bytes());
    let p = peer(&r);
    let err = p.recv(&mut Vec::new(), None).unwrap_err();
    assert!(matches!(err, QueueError::Corrupt(_)), "{err}");
    // And for a consumer that had already started.
    let r = ring(256);
    r.send(&[b"hello"], None).unwrap();
    assert_eq!(recv(&r), b"hello");
    scribble(&r, TAIL, &1_000_000u64.to_le_bytes());
    let err = r.recv(&mut Vec::new(), None).unwrap_err();
    assert!(matches!(err, QueueError::Corrupt(_)), "{err}");
}

#[test]
fn garbage_reader_position_is_an_error_not_a_panic() {
    let r = ring(64);
    r.send(&[&[0; 40]], None).unwrap();
    scribble(&r, 128, &u64::MAX.to_le_bytes()); // head
    let err = r.send(&[&[0; 40]], None).unwrap_err();
    assert!(matches!(err, QueueError::Corrupt(_)), "{err}");
}

#[test]
fn positions_at_the_end_of_the_u64_range_are_an_error_not_an_overflow() {
    // Before: a producer starting there overflowed `tail + 8` (a panic in a debug build; in a
    // release build the message went out at a wrapped position), a consumer waited forever.
    let r = ring(256);
    for at in [TAIL, 128] {
        scribble(&r, at, &(u64::MAX - 3).to_le_bytes());
    }
    let err = peer(&r).send(&[b"hello"], SHORT).unwrap_err();
    assert!(matches!(err, QueueError::Corrupt(_)), "{err}");
    let err = peer(&r).recv(&mut Vec::new(), SHORT).unwrap_err();
    assert!(matches!(err, QueueError::Corrupt(_)), "{err}");
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Ring>();
    check::<ShmRegion>();
    check::<rloader_queue::Doorbell>();
}

#[test]
fn send_partial_streams_a_large_message_across_calls_without_closing() {
    let r = Arc::new(ring(64));
    let big: Vec<u8> = (0..10_007u32).map(|i| (i % 253) as u8).collect();
    // Nobody reads yet: the first call hands over what fits and keeps its place.
    assert!(!r.send_partial(&[b"h", &big], Some(Duration::ZERO)).unwrap());
    assert!(!r.is_closed());
    // Another message may not cut in.
    assert!(matches!(
        r.send(&[b"x"], SHORT),
        Err(QueueError::Corrupt(_))
    ));
    let reader = {
        let r = Arc::clone(&r);
        thread::spawn(move || (recv(&r), recv(&r)))
    };
    // Then the rest, however many calls it takes while the reader keeps pace.
    while !r
        .send_partial(&[b"h", &big], Some(Duration::from_millis(1)))
        .unwrap()
    {}
    r.send(&[b"next"], LONG).unwrap();
    let (got, next) = reader.join().unwrap();
    assert_eq!(got[0], b'h');
    assert_eq!(&got[1..], &big[..]);
    assert_eq!(next, b"next");
}

#[test]
fn send_partial_of_a_message_that_fits_is_all_or_nothing() {
    let r = ring(64);
    assert!(r.send_partial(&[&[7u8; 40]], SHORT).unwrap());
    // No room for another 40 bytes: nothing written, the ring stays usable.
    assert!(matches!(
        r.send_partial(&[&[8u8; 40]], SHORT),
        Err(QueueError::Timeout)
    ));
    assert_eq!(recv(&r), vec![7u8; 40]);
    assert!(r.send_partial(&[&[8u8; 40]], SHORT).unwrap());
    assert_eq!(recv(&r), vec![8u8; 40]);
}
