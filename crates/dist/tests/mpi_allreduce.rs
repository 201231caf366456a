//! Multi-rank test of the MPI communicator. Run under `mpirun -np N` for any N >= 1 (`cargo xtask
//! test` runs N = 1, 2, 4). Every rank checks every result itself, prints one PASS line, and on
//! the first failed check prints the reason and aborts the whole job with a non-zero status.

use dist::{Communicator, Runtime, World};

/// Vector lengths: empty, one element, odd, a SIMD-unfriendly prime, and a large buffer (4 MiB)
/// that MPI sends in pipelined segments.
const LENGTHS: [usize; 7] = [0, 1, 2, 7, 31, 1000, (1 << 20) + 3];

/// Contribution of `rank` at index `i`: (rank + 1) * (1 + i mod 13). Small integers, so every sum
/// below is exact in f32 and compared with `==`.
fn contribution(rank: usize, i: usize) -> f32 {
    ((rank + 1) * (1 + i % 13)) as f32
}

struct Checker<'a> {
    world: &'a World,
    checks: usize,
}

impl Checker<'_> {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            eprintln!(
                "mpi_allreduce: rank {}/{}: FAIL: {}",
                self.world.rank(),
                self.world.size(),
                what()
            );
            self.world.abort(1);
        }
    }

    /// Checks `got` elementwise against `want(i)`, reporting the first mismatch.
    fn check_vec(&mut self, name: &str, got: &[f32], want: impl Fn(usize) -> f32) {
        let bad = got.iter().enumerate().find(|&(i, &g)| g != want(i));
        self.check(bad.is_none(), || {
            let (i, g) = bad.unwrap();
            format!(
                "{name}: len {}: element {i} is {g}, expected {}",
                got.len(),
                want(i)
            )
        });
    }
}

fn run(world: &World) -> usize {
    let rank = world.rank();
    let size = world.size();
    let mut c = Checker { world, checks: 0 };
    let triangle = (size * (size + 1) / 2) as f32;

    // allreduce_sum: every rank contributes rank + 1 (times an index pattern).
    for &len in &LENGTHS {
        let mut buf: Vec<f32> = (0..len).map(|i| contribution(rank, i)).collect();
        let r = world.allreduce_sum(&mut buf);
        c.check(r.is_ok(), || format!("allreduce_sum len {len}: {r:?}"));
        c.check_vec("allreduce_sum", &buf, |i| triangle * (1 + i % 13) as f32);
    }

    // allreduce_sum_overlapped: chunks posted out of order with new contents, an empty chunk,
    // a large one, and chunks left unposted (summed afterwards with the buffer's contents).
    let chunks = [3, 0, (1 << 20) + 1, 7, 5];
    let total: usize = chunks.iter().sum();
    let mut buf: Vec<f32> = (0..total).map(|i| contribution(rank, i)).collect();
    let start = |k: usize| chunks[..k].iter().sum::<usize>();
    let r = world.allreduce_sum_overlapped(&mut buf, &chunks, &mut |poster| {
        // Chunk 2 first, filled with 2 × contribution; then chunk 0 as it is; 1, 3, 4 left.
        poster.post(2, &mut |dst| {
            for (j, v) in dst.iter_mut().enumerate() {
                *v = 2.0 * contribution(rank, start(2) + j);
            }
        })?;
        poster.post(0, &mut |_| {})?;
        let twice = poster.post(0, &mut |_| {});
        let missing = poster.post(9, &mut |_| {});
        assert!(
            twice.is_err() && missing.is_err(),
            "posting twice or out of range"
        );
        Ok(())
    });
    c.check(r.is_ok(), || format!("allreduce_sum_overlapped: {r:?}"));
    c.check_vec("allreduce_sum_overlapped", &buf, |i| {
        let factor = if (start(2)..start(3)).contains(&i) {
            2.0
        } else {
            1.0
        };
        factor * triangle * (1 + i % 13) as f32
    });
    let r = world.allreduce_sum_overlapped(&mut buf, &[1, 2], &mut |_| Ok(()));
    c.check(r.is_err(), || "chunks not adding up must fail".into());

    // allreduce_mean: mean of (rank + 1) over ranks is (size + 1) / 2.
    let mut buf: Vec<f32> = (0..1001).map(|_| (rank + 1) as f32).collect();
    world.allreduce_mean(&mut buf).unwrap();
    let mean = (size + 1) as f32 / 2.0;
    let ok = buf.iter().all(|&x| (x - mean).abs() <= 1e-6 * mean);
    c.check(ok, || {
        format!("allreduce_mean: got {}, expected {mean}", buf[0])
    });

    // broadcast from every root.
    for root in 0..size {
        let mut buf: Vec<f32> = (0..777).map(|i| (rank * 1000 + i) as f32).collect();
        world.broadcast(&mut buf, root).unwrap();
        c.check_vec("broadcast", &buf, |i| (root * 1000 + i) as f32);
    }
    let r = world.broadcast(&mut [0.0], size);
    c.check(r.is_err(), || "broadcast with root = size must fail".into());

    world.barrier().unwrap();

    // Sub-communicators: even and odd ranks, ordered by rank; collectives work on them too.
    let sub = world
        .split_by_color(Some((rank % 2) as u32), rank as u32)
        .unwrap();
    let sub = sub.expect("every rank passed a colour");
    let members: Vec<usize> = (0..size).filter(|r| r % 2 == rank % 2).collect();
    c.check(sub.size() == members.len(), || {
        format!("split: size {} expected {}", sub.size(), members.len())
    });
    c.check(sub.rank() == rank / 2, || {
        format!("split: rank {} expected {}", sub.rank(), rank / 2)
    });
    let mut buf: Vec<f32> = (0..33).map(|i| contribution(rank, i)).collect();
    sub.allreduce_sum(&mut buf).unwrap();
    let sub_sum: usize = members.iter().map(|r| r + 1).sum();
    c.check_vec("sub allreduce_sum", &buf, |i| {
        (sub_sum * (1 + i % 13)) as f32
    });
    drop(sub);

    // A rank passing no colour gets no communicator.
    let none = world.split_by_color(None, 0).unwrap();
    c.check(none.is_none(), || {
        "split with no colour must give None".into()
    });

    world.barrier().unwrap();
    c.checks
}

fn main() {
    let runtime = match Runtime::init() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mpi_allreduce: FAIL: cannot initialise MPI: {e}");
            std::process::exit(1);
        }
    };
    let world = runtime.world();
    let checks = run(&world);
    println!(
        "mpi_allreduce: rank {}/{}: PASS ({checks} checks)",
        world.rank(),
        world.size()
    );
    // `world` and `runtime` drop here: MPI_Finalize runs once, after the communicator is freed.
}
