//! Ring throughput between two threads (the shared-memory path is the same as between two
//! processes): 64-byte messages (index batches) and 4 MiB messages (pickled batches).
//!
//! `cargo bench -p rloader-queue --bench ring` (about 30 s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rloader_queue::{Ring, ShmRegion};

fn ring(capacity: usize) -> Arc<Ring> {
    let len = Ring::required_len(capacity);
    let region = Arc::new(ShmRegion::create_anonymous("bench", len, len).unwrap());
    Arc::new(Ring::init(region, 0, len).unwrap())
}

/// Sends `iters` messages of `size` bytes to a receiving thread; the time until the
/// receiver has them all.
fn transfer(ring: &Arc<Ring>, size: usize, iters: u64) -> Duration {
    let payload = vec![0xA5u8; size];
    let receiver = {
        let ring = Arc::clone(ring);
        std::thread::spawn(move || {
            let mut out = Vec::with_capacity(size);
            for _ in 0..iters {
                ring.recv(&mut out, None).unwrap();
                assert_eq!(out.len(), size);
            }
        })
    };
    let start = Instant::now();
    for _ in 0..iters {
        ring.send(&[&payload], None).unwrap();
    }
    receiver.join().unwrap();
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));

    let small = ring(1 << 20);
    g.throughput(Throughput::Elements(1));
    g.bench_function("64B messages", |b| {
        b.iter_custom(|iters| transfer(&small, 64, iters))
    });

    let large = ring(16 << 20);
    g.throughput(Throughput::Bytes(4 << 20));
    g.bench_function("4MiB messages", |b| {
        b.iter_custom(|iters| transfer(&large, 4 << 20, iters))
    });

    // Larger than the ring: streamed in chunks.
    let streamed = ring(1 << 20);
    g.bench_function("4MiB messages through a 1MiB ring", |b| {
        b.iter_custom(|iters| transfer(&streamed, 4 << 20, iters))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
