//! Fuzzing the ring's framing and positions (NOTE [Ring protocol] in protocol.rs): what one
//! side reads from shared memory that the other side wrote.
//!
//! Each input is one ring, freshly made in a reused region, and one of:
//! - a round trip: messages of random sizes (many larger than the ring, so streamed) in one to
//!   three parts, sent with `send_partial` and received with `try_recv` on one thread,
//!   interleaved, from a random start position: what arrives is what was sent;
//! - a hostile writer: positions (in order or not, far apart, near 2^63 and u64::MAX), frame
//!   headers (valid, with a bad tag, lengths at the extremes) and payload bytes written into
//!   the ring as a broken peer would; the first `try_recv` must give what a reference reader
//!   says (the message, nothing yet, `Closed` or `Corrupt`), and later ones must not panic;
//! - a hostile reader: the consumer's position set to garbage before or between sends;
//! - a round trip with one position, flag or data byte changed in the middle.
//!
//! No input may panic, hang (every wait has a zero timeout, every loop a bound) or write
//! outside its ring: the bytes after the ring are checked untouched after each input.
//!
//! `cargo test` runs a short fixed-seed round; the long one is `make fuzz`:
//! `RLOADER_FUZZ_INPUTS=10000000 cargo test --release -p rloader-queue --test fuzz -- --ignored
//! --nocapture` (`RLOADER_FUZZ_SEED` picks the seed; the run prints the one it used).
#![cfg(not(loom))]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rloader_queue::{QueueError, Ring, ShmRegion};

/// Where the ring header keeps what the peer writes (tests/ring.rs uses the same offsets).
const CLOSED: usize = 24;
const TAIL: usize = 64;
const HEAD: usize = 128;
const DATA: usize = Ring::required_len(0);
const FRAME_TAG: u64 = 0x5251;
const NOW: Option<Duration> = Some(Duration::ZERO);
/// Bytes after the ring that must stay as they were.
const CANARY: usize = 256;
const CANARY_BYTE: u8 = 0xC3;
const CAPACITIES: [usize; 8] = [16, 17, 24, 63, 64, 100, 256, 1000];

#[path = "../../test-support/fuzz_rng.rs"]
mod fuzz_rng;
use fuzz_rng::Rng;

/// A stream position: small, random, or near 2^63 or u64::MAX.
fn position(rng: &mut Rng) -> u64 {
    let near = |x: u64, rng: &mut Rng| x.wrapping_sub(rng.below(4096) as u64);
    match rng.below(5) {
        0 => rng.below(1 << 20) as u64,
        1 => rng.next() >> rng.below(64),
        2 => near(1 << 63, rng),
        3 => near(u64::MAX, rng),
        _ => near((1 << 63) + 4096, rng),
    }
}

#[derive(Default)]
struct Counts {
    inputs: BTreeMap<&'static str, u64>,
    outcomes: BTreeMap<String, u64>,
    messages: u64,
    slowest: Duration,
}

impl Counts {
    fn input(&mut self, what: &'static str) {
        *self.inputs.entry(what).or_default() += 1;
    }

    fn outcome<T>(&mut self, what: &str, r: &Result<T, QueueError>) {
        let name = match r {
            Ok(_) => "ok".to_string(),
            Err(e) => {
                let name = format!("{e:?}");
                name.split([' ', '{', '('])
                    .next()
                    .unwrap_or_default()
                    .to_string()
            }
        };
        *self.outcomes.entry(format!("{what}: {name}")).or_default() += 1;
    }

    fn report(&self, seed: u64, elapsed: Duration) -> String {
        let total: u64 = self.inputs.values().sum();
        let errors: u64 = self
            .outcomes
            .iter()
            .filter(|(k, _)| !k.ends_with(": ok"))
            .map(|(_, n)| n)
            .sum();
        let mut out = format!(
            "RLOADER_FUZZ_SEED={seed}: {total} ring inputs in {:.1} s, {errors} errors returned, {} \
             messages round-tripped, slowest input {} us\n",
            elapsed.as_secs_f64(),
            self.messages,
            self.slowest.as_micros()
        );
        for (what, n) in &self.inputs {
            out += &format!("  inputs {what}: {n}\n");
        }
        for (what, n) in &self.outcomes {
            out += &format!("  {what}: {n}\n");
        }
        out
    }
}

/// One region, reused: a ring at offset 0 and canary bytes after it.
struct Bench {
    region: Arc<ShmRegion>,
}

impl Bench {
    fn new() -> Self {
        let len = Ring::required_len(*CAPACITIES.last().unwrap()) + CANARY;
        let region = ShmRegion::create_anonymous("rloader fuzz ring", len, len).unwrap();
        Bench {
            region: Arc::new(region),
        }
    }

    /// A fresh ring of `cap` data bytes (the producer's handle) and its canary set.
    fn ring(&self, cap: usize) -> Ring {
        let len = Ring::required_len(cap);
        // SAFETY: inside the region; no handle uses these bytes.
        unsafe { std::ptr::write_bytes(self.region.as_ptr().add(len), CANARY_BYTE, CANARY) };
        Ring::init(self.region.clone(), 0, len).unwrap()
    }

    /// The peer's handle on `ring`.
    fn peer(&self, ring: &Ring) -> Ring {
        Ring::attach(self.region.clone(), 0, Ring::required_len(ring.capacity())).unwrap()
    }

    fn canary_intact(&self, cap: usize) {
        let at = Ring::required_len(cap);
        // SAFETY: inside the region.
        let after = unsafe { std::slice::from_raw_parts(self.region.as_ptr().add(at), CANARY) };
        assert!(
            after.iter().all(|&b| b == CANARY_BYTE),
            "a ring of {cap} bytes wrote past its end"
        );
    }

    fn write(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= self.region.len());
        // SAFETY: inside the region; the handles are between calls, as a peer would find them.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.region.as_ptr().add(at), bytes.len())
        };
    }

    fn read(&self, at: usize, n: usize) -> Vec<u8> {
        assert!(at + n <= self.region.len());
        // SAFETY: inside the region.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr().add(at), n) }.to_vec()
    }

    fn set_u64(&self, at: usize, v: u64) {
        self.write(at, &v.to_le_bytes());
    }

    /// Stream bytes at position `pos` of a ring of `cap` bytes, wrapping as the ring does.
    fn put(&self, cap: usize, pos: u64, bytes: &[u8]) {
        for (i, &b) in bytes.iter().enumerate() {
            let at = (pos.wrapping_add(i as u64) % cap as u64) as usize;
            self.write(DATA + at, &[b]);
        }
    }

    fn get(&self, cap: usize, pos: u64, n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| {
                let at = (pos.wrapping_add(i as u64) % cap as u64) as usize;
                self.read(DATA + at, 1)[0]
            })
            .collect()
    }
}

/// Sends `msgs` from `tx` to `rx` on one thread, interleaving partial sends and receives,
/// and returns what arrived. Panics if nothing moves for a while (a hang).
fn pump(tx: &Ring, rx: &Ring, msgs: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut out = Vec::new();
    for parts in msgs {
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let mut rounds = 0;
        loop {
            rounds += 1;
            assert!(
                rounds < 100_000,
                "no progress sending {} bytes",
                parts.concat().len()
            );
            match tx.send_partial(&parts, NOW) {
                Ok(true) => break,
                Ok(false) | Err(QueueError::Timeout) => {}
                Err(e) => panic!("send: {e}"),
            }
            if rx.try_recv(&mut out).unwrap() {
                got.push(std::mem::take(&mut out));
            }
        }
    }
    let mut rounds = 0;
    while rx.has_message() {
        rounds += 1;
        assert!(rounds < 100_000, "no progress receiving");
        if rx.try_recv(&mut out).unwrap() {
            got.push(std::mem::take(&mut out));
        }
    }
    got
}

/// Messages of one to three parts each, up to three times the ring's size.
fn messages(rng: &mut Rng, cap: usize) -> Vec<Vec<Vec<u8>>> {
    (0..1 + rng.below(5))
        .map(|_| {
            let len = match rng.below(4) {
                0 => rng.below(cap.saturating_sub(8) + 1),
                1 => cap - 8 + rng.below(3),
                _ => rng.below(3 * cap + 1),
            };
            let whole = rng.bytes(len);
            let cut1 = rng.below(len + 1);
            let cut2 = cut1 + rng.below(len - cut1 + 1);
            match rng.below(3) {
                0 => vec![whole],
                1 => vec![whole[..cut1].to_vec(), whole[cut1..].to_vec()],
                _ => vec![
                    whole[..cut1].to_vec(),
                    whole[cut1..cut2].to_vec(),
                    whole[cut2..].to_vec(),
                ],
            }
        })
        .collect()
}

fn round_trip(b: &Bench, rng: &mut Rng, cap: usize, counts: &mut Counts) {
    counts.input("round trip");
    let tx = b.ring(cap);
    if rng.one_in(2) {
        // Any start below 2^63 is a valid position: wrap-around at odd offsets.
        let start = position(rng).min(1 << 63);
        b.set_u64(TAIL, start);
        b.set_u64(HEAD, start);
    }
    let rx = b.peer(&tx);
    let msgs = messages(rng, cap);
    let got = pump(&tx, &rx, &msgs);
    let want: Vec<Vec<u8>> = msgs.iter().map(|p| p.concat()).collect();
    assert_eq!(got, want);
    counts.messages += got.len() as u64;
}

/// What a consumer's first `try_recv` must return on a ring whose shared words and bytes a
/// peer wrote: Ok(Some(message)), Ok(None) (nothing whole yet), or an error.
fn expected_first(b: &Bench, cap: usize) -> Result<Option<Vec<u8>>, &'static str> {
    let word = |at| u64::from_le_bytes(b.read(at, 8).try_into().unwrap());
    let (head, tail, closed) = (word(HEAD), word(TAIL), b.read(CLOSED, 4) != [0; 4]);
    if head == tail && !closed {
        // try_recv looks no further: nothing to read.
        return Ok(None);
    }
    if head > tail || tail - head > cap as u64 || head > 1 << 63 {
        return Err("Corrupt");
    }
    let avail = tail - head;
    if avail < 8 {
        return match (avail, closed) {
            (0, false) => Ok(None),
            (_, true) => Err("Closed"),
            _ => Ok(None),
        };
    }
    let frame = u64::from_le_bytes(b.get(cap, head, 8).try_into().unwrap());
    if frame >> 48 != FRAME_TAG {
        return Err("Corrupt");
    }
    let len = frame & ((1 << 48) - 1);
    if len <= avail - 8 {
        Ok(Some(b.get(cap, head + 8, len as usize)))
    } else if closed {
        Err("Closed")
    } else {
        Ok(None)
    }
}

fn hostile_writer(b: &Bench, rng: &mut Rng, cap: usize, counts: &mut Counts) {
    counts.input("hostile writer");
    let tx = b.ring(cap);
    let head = if rng.one_in(3) {
        position(rng)
    } else {
        rng.below(1 << 40) as u64
    };
    let tail = match rng.below(6) {
        0..=2 => head.wrapping_add(rng.below(cap + 1) as u64),
        3 => head.wrapping_add(rng.below(2 * cap + 16) as u64),
        4 => head.wrapping_sub(1 + rng.below(16) as u64),
        _ => position(rng),
    };
    b.set_u64(HEAD, head);
    b.set_u64(TAIL, tail);
    if rng.one_in(6) {
        b.write(CLOSED, &(rng.next() as u32 | 1).to_le_bytes());
    }
    // The ring's bytes from head on, one lap: frames (some broken) or garbage.
    let mut stream = Vec::with_capacity(cap + 8);
    while stream.len() < cap {
        if rng.one_in(8) {
            let n = 1 + rng.below(cap);
            stream.extend(rng.bytes(n));
            continue;
        }
        let len = match rng.below(6) {
            0 => (1 << 48) - 1 - rng.below(4) as u64,
            1 => cap as u64 - 8 + rng.below(3) as u64,
            2 => rng.next() & ((1 << 48) - 1),
            _ => rng.below(cap) as u64,
        };
        let tag = if rng.one_in(8) {
            rng.next() >> 48
        } else {
            FRAME_TAG
        };
        stream.extend((tag << 48 | len).to_le_bytes());
        let n = (len as usize).min(cap);
        stream.extend(rng.bytes(n));
    }
    stream.truncate(cap);
    b.put(cap, head, &stream);
    let rx = b.peer(&tx);
    let want = expected_first(b, cap);
    let mut out = Vec::new();
    let first = rx.try_recv(&mut out);
    counts.outcome("hostile writer", &first);
    match (&first, &want) {
        (Ok(true), Ok(Some(msg))) => assert_eq!(&out, msg),
        (Ok(false), Ok(None)) => {}
        (Err(QueueError::Corrupt(_)), Err("Corrupt"))
        | (Err(QueueError::Closed), Err("Closed")) => {}
        _ => panic!("try_recv: {first:?}, expected {want:?} (cap {cap}, head {head}, tail {tail})"),
    }
    // Whatever follows: no panic, no large reservation.
    for _ in 0..4 {
        let r = rx.try_recv(&mut out);
        assert!(
            out.capacity() <= (4 * cap).max(1 << 12),
            "{}",
            out.capacity()
        );
        if r.is_err() {
            break;
        }
    }
    let _ = rx.recv(&mut out, NOW);
    b.canary_intact(cap);
}

fn hostile_reader(b: &Bench, rng: &mut Rng, cap: usize, counts: &mut Counts) {
    counts.input("hostile reader");
    let tx = b.ring(cap);
    let rx = b.peer(&tx);
    if rng.one_in(2) {
        // The producer has started: garbage then shows in refresh_head, not at the start.
        let first = messages(rng, cap);
        let _ = pump(&tx, &rx, &first[..1]);
    }
    let tail = u64::from_le_bytes(b.read(TAIL, 8).try_into().unwrap());
    let head = match rng.below(3) {
        0 => tail.wrapping_add(1 + rng.below(64) as u64),
        1 => tail.wrapping_sub(cap as u64 + 1 + rng.below(64) as u64),
        _ => position(rng),
    };
    b.set_u64(HEAD, head);
    if rng.one_in(2) {
        b.set_u64(TAIL, position(rng));
    }
    for parts in messages(rng, cap) {
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let r = if rng.one_in(2) {
            tx.send(&parts, NOW)
        } else {
            tx.send_partial(&parts, NOW).map(|_| ())
        };
        counts.outcome("hostile reader", &r);
        b.canary_intact(cap);
    }
}

/// A round trip with one shared word or byte changed halfway.
fn corrupted_midway(b: &Bench, rng: &mut Rng, cap: usize, counts: &mut Counts) {
    counts.input("corrupted midway");
    let tx = b.ring(cap);
    let rx = b.peer(&tx);
    let msgs = messages(rng, cap);
    let mut out = Vec::new();
    for (i, parts) in msgs.iter().enumerate() {
        let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        if i == msgs.len() / 2 {
            match rng.below(4) {
                0 => b.set_u64(TAIL, position(rng)),
                1 => b.set_u64(HEAD, position(rng)),
                2 => b.write(CLOSED, &[1, 0, 0, 0]),
                _ => {
                    let at = DATA + rng.below(cap);
                    b.write(at, &[rng.next() as u8]);
                }
            }
        }
        for _ in 0..1 + rng.below(4) {
            let r = tx.send_partial(&parts, NOW);
            counts.outcome("corrupted midway, send", &r);
            let r = rx.try_recv(&mut out);
            counts.outcome("corrupted midway, recv", &r);
            assert!(out.capacity() <= (8 * cap).max(1 << 12));
        }
    }
    b.canary_intact(cap);
}

fn run(seed: u64, inputs: u64) -> Counts {
    let mut rng = Rng::new(seed);
    let mut counts = Counts::default();
    let bench = Bench::new();
    for _ in 0..inputs {
        let t = Instant::now();
        let cap = CAPACITIES[rng.below(CAPACITIES.len())];
        match rng.below(8) {
            0 | 1 => round_trip(&bench, &mut rng, cap, &mut counts),
            2..=4 => hostile_writer(&bench, &mut rng, cap, &mut counts),
            5 | 6 => hostile_reader(&bench, &mut rng, cap, &mut counts),
            _ => corrupted_midway(&bench, &mut rng, cap, &mut counts),
        }
        counts.slowest = counts.slowest.max(t.elapsed());
    }
    counts
}

#[test]
fn a_short_fixed_seed_run() {
    let t = Instant::now();
    let counts = run(0x5eed, 200_000);
    println!("{}", counts.report(0x5eed, t.elapsed()));
    assert!(counts.messages > 100_000);
    for outcome in [
        "hostile writer: ok",
        "hostile writer: Corrupt",
        "hostile writer: Closed",
        "hostile reader: Corrupt",
    ] {
        assert!(counts.outcomes.get(outcome) > Some(&500), "{outcome}");
    }
}

/// `make fuzz`: RLOADER_FUZZ_INPUTS inputs (10 million unless set), from RLOADER_FUZZ_SEED (or
/// the clock's nanoseconds), with counts printed at the end.
#[test]
#[ignore = "long: make fuzz"]
fn a_long_run() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let inputs = env("RLOADER_FUZZ_INPUTS").unwrap_or(10_000_000);
    let seed = env("RLOADER_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!("rloader-queue fuzz: {inputs} inputs, RLOADER_FUZZ_SEED={seed}");
    let t = Instant::now();
    let counts = run(seed, inputs);
    println!("{}", counts.report(seed, t.elapsed()));
}
