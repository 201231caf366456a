//! The threads of one parallel product (a *crew*): each part of a large enough product runs
//! bound to a CPU of its own for the length of the product, then gets its affinity mask back.
//!
//! Why: this project's 2-vCPU guest (`sched_vcpu_pack=15`) packs threads of low recent load onto
//! one vCPU. A worker woken for a parallel product is queued on the CPU of the part that woke it
//! while the other CPU idles, and a part moved off that CPU is soon packed back onto it (session
//! 39, `two_trace` on s39-twothr-trace: unbound 2-thread products of 64×50176×576 had their
//! second part start 1-8 ms late on the first part's CPU in 7-12 of 20; a part that moved itself
//! to the idle CPU at its start was packed back and ran at a quarter of its rate). So:
//! - each part, when it starts, binds itself to its current CPU, or to another CPU of its mask
//!   when a part of the product holds that one (moving there at once);
//! - while a part of the product has not started, the running parts yield their CPU at a
//!   checkpoint (the top of each jr step) once every [`LATE`], so that a part queued behind them
//!   on their CPU starts (and moves);
//! - each part gets its own mask back when it ends.
//!
//! Binding is best effort (`sched_setaffinity`): a part whose mask holds one CPU (a bound
//! worker, `bind_workers`) or fewer CPUs than the product has parts, or whose CPU is past the
//! crew's 64, runs as it is. Results do not depend on where the parts run.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// While another part of its product has not started, a part yields its CPU at a checkpoint
/// once every this long (the first time this long after it started). A woken worker placed on
/// an idle CPU starts within 10-120 µs here (session 39, `two_trace`, bound and unbound); one
/// queued behind a running part, 1-8 ms. A yield with nothing else to run costs ~1 µs.
pub(crate) const LATE: Duration = Duration::from_micros(100);

/// Products of at least this many multiply-adds (`m · n · k`, ~0.25 ms on two Zen 5 cores) run
/// with a crew; smaller ones would pay its few syscalls a part for too little.
pub(crate) const MIN_MNK: usize = 1 << 26;

/// Most CPUs a crew hands out (one bit each).
const MAX_CPUS: usize = 64;

/// The parts of one parallel product: how many, how many have started, and which CPUs they hold.
pub(crate) struct Crew {
    parts: usize,
    started: AtomicUsize,
    /// Bit `c`: a running part holds CPU `c`.
    held: AtomicU64,
}

impl Crew {
    /// A crew of `parts` parts.
    pub(crate) fn new(parts: usize) -> Self {
        Self {
            parts,
            started: AtomicUsize::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// A part of the product starts on the current thread: binds it to a CPU of its own.
    pub(crate) fn join(&self) -> Member<'_> {
        self.started.fetch_add(1, Ordering::Relaxed);
        let bound = bind(self.parts, &self.held);
        Member {
            crew: self,
            bound,
            next_yield: Cell::new(Instant::now() + LATE),
        }
    }

    /// A part with nothing to do starts (and ends): the others stop waiting for it.
    pub(crate) fn skip(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }
}

/// One running part of a crew (see [`Crew::join`]); gets its mask back when dropped.
pub(crate) struct Member<'c> {
    crew: &'c Crew,
    /// The CPU it holds and the mask to restore.
    bound: Option<(usize, Mask)>,
    /// When it may yield next.
    next_yield: Cell<Instant>,
}

impl Member<'_> {
    /// A point between two steps of the part's work: yields the CPU (once every [`LATE`]) while a
    /// part of the product has not started.
    #[inline]
    pub(crate) fn checkpoint(&self) {
        let crew = self.crew;
        if crew.started.load(Ordering::Relaxed) < crew.parts {
            let now = Instant::now();
            if now >= self.next_yield.get() {
                std::thread::yield_now();
                self.next_yield.set(now + LATE);
            }
        }
    }
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        if let Some((cpu, mask)) = self.bound.take() {
            restore(&mask);
            self.crew.held.fetch_and(!(1 << cpu), Ordering::Relaxed);
        }
    }
}

#[cfg(target_os = "linux")]
type Mask = rustix::thread::CpuSet;

#[cfg(not(target_os = "linux"))]
type Mask = ();

/// Binds the current thread to its current CPU if no part holds it in `held`, else to the next
/// CPU of its mask that none holds (moving it there), and marks it held; the CPU and the mask to
/// restore, or `None` (nothing held) when the mask has fewer than `parts.max(2)` CPUs or cannot
/// be read or set.
#[cfg(target_os = "linux")]
fn bind(parts: usize, held: &AtomicU64) -> Option<(usize, Mask)> {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_getcpu, sched_setaffinity};
    let mask = sched_getaffinity(None).ok()?;
    if (mask.count() as usize) < parts.max(2) {
        return None;
    }
    let here = sched_getcpu();
    let to = (0..CpuSet::MAX_CPU)
        .map(|d| (here + d) % CpuSet::MAX_CPU)
        .find(|&c| {
            mask.is_set(c)
                && c < MAX_CPUS
                && held.fetch_or(1 << c, Ordering::Relaxed) & (1 << c) == 0
        })?;
    let mut one = CpuSet::new();
    one.set(to);
    if sched_setaffinity(None, &one).is_err() {
        held.fetch_and(!(1 << to), Ordering::Relaxed);
        restore(&mask);
        return None;
    }
    Some((to, mask))
}

#[cfg(not(target_os = "linux"))]
fn bind(_parts: usize, _held: &AtomicU64) -> Option<(usize, Mask)> {
    None
}

/// Gives the current thread `mask` back (best effort: a thread left bound still computes right).
#[cfg(target_os = "linux")]
fn restore(mask: &Mask) {
    let _ = rustix::thread::sched_setaffinity(None, mask);
}

#[cfg(not(target_os = "linux"))]
fn restore(_mask: &Mask) {}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::thread::ThreadId;

    use rayon::ThreadPoolBuilder;

    use crate::store::{Store, Tile};
    use crate::{allowed_cpus, bind_workers};

    /// A store that records the affinity mask of every thread that stores a tile.
    struct Masks {
        m: usize,
        n: usize,
        seen: Mutex<HashMap<ThreadId, Vec<Vec<usize>>>>,
    }

    impl Store for Masks {
        fn rows(&self) -> usize {
            self.m
        }
        fn cols(&self) -> usize {
            self.n
        }
        fn store_tile(&self, t: &Tile<'_>) {
            // One mask per pass of a tile's first row and column is plenty.
            if t.i() == 0 && t.j().is_multiple_of(256) {
                let mask = allowed_cpus().expect("mask");
                let mut seen = self.seen.lock().expect("lock");
                seen.entry(std::thread::current().id())
                    .or_default()
                    .push(mask);
            }
        }
    }

    fn operands(m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
        let a = (0..m * k)
            .map(|i| ((i * 7) % 13) as f32 * 0.25 - 1.5)
            .collect();
        let b = (0..k * n)
            .map(|i| ((i * 5) % 11) as f32 * 0.25 - 1.25)
            .collect();
        (a, b)
    }

    #[test]
    fn parts_run_bound_to_cpus_of_their_own_and_get_their_masks_back() {
        let cpus = allowed_cpus().expect("affinity readable on the test hosts");
        if cpus.len() < 2 {
            eprintln!("one CPU: nothing to check");
            return;
        }
        let pool = ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        // m · n · k ≥ MIN_MNK: a crewed product.
        let (m, n, k) = (64, 4096, 512);
        assert!(m * n * k >= super::MIN_MNK);
        let (a, b) = operands(m, n, k);
        let a = crate::MatRef::row_major("a", &a, m, k, k).expect("a");
        let b = crate::MatRef::row_major("b", &b, k, n, n).expect("b");
        for round in 0..4 {
            let mut store = Masks {
                m,
                n,
                seen: Mutex::new(HashMap::new()),
            };
            pool.install(|| crate::gemm_with(&a, &b, &mut store).expect("product"));
            let seen = store.seen.into_inner().expect("lock");
            let mut held = Vec::new();
            for masks in seen.values() {
                // Each part holds one CPU for the whole product.
                assert!(
                    masks.iter().all(|s| s.len() == 1),
                    "round {round}: {masks:?}"
                );
                assert!(
                    masks.iter().all(|s| s == &masks[0]),
                    "round {round}: {masks:?}"
                );
                held.push(masks[0][0]);
            }
            held.sort_unstable();
            held.dedup();
            assert_eq!(
                held.len(),
                seen.len(),
                "round {round}: two parts on one CPU: {seen:?}"
            );
            // After the product every worker has the process's mask back.
            for (i, mask) in pool.broadcast(|ctx| (ctx.index(), allowed_cpus().expect("mask"))) {
                assert_eq!(mask, cpus, "round {round}: worker {i}");
            }
        }
    }

    #[test]
    fn crewed_products_match_the_reference_on_unbound_and_bound_pools() {
        let cpus = allowed_cpus().expect("affinity readable on the test hosts");
        let unbound = ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        let bound = bind_workers(ThreadPoolBuilder::new().num_threads(2))
            .expect("bind")
            .build()
            .expect("pool");
        // Odd sizes (edge tiles), each past MIN_MNK.
        for &(m, n, k) in &[(67, 4099, 301), (131, 1031, 517)] {
            assert!(m * n * k >= super::MIN_MNK);
            let (a, b) = operands(m, n, k);
            let want: Vec<f64> = (0..m * n)
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    (0..k)
                        .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                        .sum()
                })
                .collect();
            for (name, pool) in [("unbound", &unbound), ("bound", &bound)] {
                let mut c = vec![f32::NAN; m * n];
                pool.install(|| {
                    crate::sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)
                        .expect("sgemm")
                });
                for (e, (&got, &w)) in c.iter().zip(&want).enumerate() {
                    // Products of quarter-steps summed in f32: exact below 2^24.
                    assert_eq!(f64::from(got), w, "{name} c[{e}] of {m}x{n}x{k}");
                }
            }
            // A bound pool keeps its workers' single CPUs.
            for (i, mask) in bound.broadcast(|ctx| (ctx.index(), allowed_cpus().expect("mask"))) {
                assert_eq!(mask, vec![cpus[i % cpus.len()]], "bound worker {i}");
            }
        }
    }
}
