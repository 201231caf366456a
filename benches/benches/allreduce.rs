//! Allreduce through the communicator every distributed code path uses.
//!
//! Built without `dist`'s `mpi` feature, `Runtime::world()` is the single-process communicator,
//! so `allreduce_sum` costs argument validation and dispatch only: this bench shows that a
//! single-process run pays nothing for the distributed code path. The reference measured in the
//! same run is a `memcpy` of the same buffer (the least work any out-of-place allreduce does, and
//! what the MPI communicator adds on top of `MPI_Allreduce`). Throughput is declared in bytes.
//!
//! It also appends one extra record through `benches::emit_record`: the copy bandwidth of this
//! machine measured with a plain timer, a reference for reading allreduce throughputs.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dist::{Communicator, Runtime, SingleProcess};

/// Buffer lengths in f32 elements: a bias vector, a conv layer, a large fully connected layer.
const LENGTHS: [usize; 4] = [1 << 10, 1 << 14, 1 << 18, 1 << 22];

fn allreduce(c: &mut Criterion) {
    let runtime = Runtime::init().expect("communication layer initialises once");
    let world = runtime.world();
    let mut group = c.benchmark_group("allreduce");
    for len in LENGTHS {
        let bytes = (len * size_of::<f32>()) as u64;
        group.throughput(Throughput::Bytes(bytes));
        let mut buf: Vec<f32> = (0..len).map(|i| i as f32).collect();
        group.bench_with_input(BenchmarkId::new("world", len), &len, |b, _| {
            b.iter(|| {
                world
                    .allreduce_sum(black_box(&mut buf))
                    .expect("valid buffer")
            })
        });
        group.bench_with_input(BenchmarkId::new("single_process", len), &len, |b, _| {
            b.iter(|| {
                SingleProcess
                    .allreduce_sum(black_box(&mut buf))
                    .expect("valid buffer")
            })
        });
        let src = buf.clone();
        group.bench_with_input(BenchmarkId::new("memcpy_reference", len), &len, |b, _| {
            b.iter(|| buf.copy_from_slice(black_box(&src)))
        });
    }
    group.finish();
    emit_copy_bandwidth();
}

/// Measures copy bandwidth on a 64 MiB buffer (larger than the caches) with a plain timer, best
/// of five, and records it in bytes/s (read + write traffic counted once, as criterion does).
fn emit_copy_bandwidth() {
    let len = 16 << 20;
    let src = vec![1.0f32; len];
    let mut dst = vec![0.0f32; len];
    let best = (0..5)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    let bytes = (len * size_of::<f32>()) as f64;
    if let Err(e) = benches::emit_record(
        "machine",
        "memcpy_64MiB",
        "copy_bandwidth",
        bytes / best,
        "bytes/s",
    ) {
        eprintln!("cannot write extra bench record: {e}");
    }
}

criterion_group!(benches, allreduce);
criterion_main!(benches);
