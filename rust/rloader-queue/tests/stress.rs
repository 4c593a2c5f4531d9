//! Threads hammering rings and a doorbell: content, order, no lost wake-up.
#![cfg(not(loom))]

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rloader_queue::{Doorbell, Ring, ShmRegion};

/// SplitMix64: a seeded, dependency-free source of sizes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Message `k`'s size: mostly small, some near the ring size, a few larger (streamed).
fn size_of(rng: &mut Rng, capacity: usize) -> usize {
    match rng.next() % 100 {
        0 => capacity + (rng.next() % (3 * capacity as u64)) as usize,
        1..=9 => (rng.next() % capacity as u64) as usize,
        _ => (rng.next() % 200) as usize,
    }
}

fn fill(k: u64, len: usize, buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend((0..len).map(|i| (k as usize).wrapping_mul(31).wrapping_add(i) as u8));
}

fn region(len: usize) -> Arc<ShmRegion> {
    Arc::new(ShmRegion::create_anonymous("stress", len, len).unwrap())
}

#[test]
fn spsc_200k_random_sizes_through_a_small_ring() {
    const MESSAGES: u64 = 200_000;
    const CAPACITY: usize = 4096;
    const SEED: u64 = 0x5EED;
    let len = Ring::required_len(CAPACITY);
    let region = region(len);
    let tx = Ring::init(Arc::clone(&region), 0, len).unwrap();
    let rx = Ring::attach(region, 0, len).unwrap();
    let producer = thread::spawn(move || {
        let mut rng = Rng(SEED);
        let mut buf = Vec::new();
        for k in 0..MESSAGES {
            let n = size_of(&mut rng, CAPACITY);
            fill(k, n, &mut buf);
            // Split some messages in two parts to exercise the gather path.
            let cut = (k as usize) % (n + 1);
            tx.send(&[&buf[..cut], &buf[cut..]], Some(Duration::from_secs(30)))
                .unwrap();
        }
        tx.close();
    });
    let mut rng = Rng(SEED);
    let mut expected = Vec::new();
    let mut out = Vec::new();
    for k in 0..MESSAGES {
        let n = size_of(&mut rng, CAPACITY);
        fill(k, n, &mut expected);
        // Alternate blocking and polling receives.
        if k % 3 == 0 {
            while !rx.try_recv(&mut out).unwrap() {
                thread::yield_now();
            }
        } else {
            rx.recv(&mut out, Some(Duration::from_secs(30))).unwrap();
        }
        assert!(
            out == expected,
            "message {k}: {} bytes, expected {n}",
            out.len()
        );
    }
    assert!(matches!(
        rx.recv(&mut out, Some(Duration::from_secs(30))),
        Err(rloader_queue::QueueError::Closed)
    ));
    producer.join().unwrap();
}

/// Several producers, each on its own ring, all ringing one doorbell; one consumer that
/// sleeps on the doorbell whenever a sweep of the rings found nothing. A lost wake-up
/// would show as a wait that times out while messages are pending.
#[test]
fn doorbell_many_producers_one_sleeping_consumer() {
    const PRODUCERS: usize = 4;
    const EACH: u64 = 20_000;
    const CAPACITY: usize = 1024;
    let ring_len = Ring::required_len(CAPACITY);
    let region = region(Doorbell::LEN + PRODUCERS * ring_len);
    let bell = Doorbell::init(Arc::clone(&region), 0);
    let rings: Vec<Ring> = (0..PRODUCERS)
        .map(|i| Ring::init(Arc::clone(&region), Doorbell::LEN + i * ring_len, ring_len).unwrap())
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|i| {
            let offset = Doorbell::LEN + i * ring_len;
            let ring = Ring::attach(Arc::clone(&region), offset, ring_len)
                .unwrap()
                .with_doorbell(Doorbell::attach(Arc::clone(&region), 0));
            thread::spawn(move || {
                let mut rng = Rng(i as u64);
                for k in 0..EACH {
                    ring.send(&[&k.to_le_bytes()], Some(Duration::from_secs(30)))
                        .unwrap();
                    // Bursts and pauses, so the consumer really goes to sleep.
                    if rng.next() % 64 == 0 {
                        thread::sleep(Duration::from_micros(rng.next() % 200));
                    }
                }
            })
        })
        .collect();

    let mut next = [0u64; PRODUCERS];
    let mut sleeps = 0;
    let mut out = Vec::new();
    while next.iter().any(|&n| n < EACH) {
        let seen = bell.current();
        let mut got = 0;
        for (i, ring) in rings.iter().enumerate() {
            while ring.try_recv(&mut out).unwrap() {
                assert_eq!(out, next[i].to_le_bytes(), "producer {i}");
                next[i] += 1;
                got += 1;
            }
        }
        if got == 0 && next.iter().any(|&n| n < EACH) {
            sleeps += 1;
            assert!(
                bell.wait(seen, Duration::from_secs(10)),
                "lost wake-up: slept 10 s with {next:?} of {EACH} received"
            );
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    println!("consumer slept {sleeps} times");
    assert!(
        sleeps > 0,
        "the consumer never slept: the test did not test waking"
    );
}

/// Several threads ring, one waits for every ring: the count adds up and no wait hangs.
#[test]
fn doorbell_counts_every_ring() {
    const RINGERS: u32 = 4;
    const EACH: u32 = 50_000;
    let region = region(Doorbell::LEN);
    let bell = Doorbell::init(Arc::clone(&region), 0);
    let ringers: Vec<_> = (0..RINGERS)
        .map(|_| {
            let b = Doorbell::attach(Arc::clone(&region), 0);
            thread::spawn(move || {
                for i in 0..EACH {
                    b.ring();
                    if i % 1000 == 0 {
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut seen = bell.current();
    while seen != RINGERS * EACH {
        assert!(
            bell.wait(seen, Duration::from_secs(10)),
            "lost wake-up at {seen}"
        );
        seen = bell.current();
    }
    for r in ringers {
        r.join().unwrap();
    }
}
