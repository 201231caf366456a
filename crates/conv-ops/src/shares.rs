//! Parallel loops whose threads leave together, so that the next parallel step finds the other
//! worker still awake.
//!
//! A rayon worker that runs out of work yields a few dozen times (tens of µs) and then sleeps
//! until the next job wakes it. On the issues' guest (`sched_vcpu_pack=15`, a 4 ms tick) such a
//! wake is sometimes queued on the waking worker's vCPU while the other vCPU idles, and the woken
//! worker then waits 1-5 ms for a tick to move it (session 36). With rayon's own joins, a
//! 2-thread deconvgemm call let one worker sleep about once per call: at the end of a parallel
//! step the thread that finished first idles for the other's last 0.1-0.6 ms and falls asleep
//! (perf sched traces of `probe_passes --threads 2`, session 37: 0.7-1.7 wakes of a probe worker
//! per call, 0-2 of every ~60 queued on the vCPU of the other worker). Here a thread that finds no
//! item left waits (yielding, at most [`WAIT_MAX`]) until the items the others have claimed are
//! done: the threads leave a step within a few µs of each other and the next step's fork (in the
//! same call, or the next call when the caller does little between them) finds the other worker
//! still spinning, not asleep.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::Result;

/// The longest a thread that has run out of items waits for the items other threads run. Longer
/// than the end gaps of balanced steps (0.1-0.6 ms), short enough that a thread parked behind
/// a late worker soon goes back to rayon.
pub(crate) const WAIT_MAX: Duration = Duration::from_millis(2);

/// Runs `f(i, item)` once for each of `items` (by value, `i` its index) on the current pool's
/// threads, at most one thread per item: each thread claims the next unclaimed item from a
/// shared counter, so a late thread's items are run by the others; a thread that finds none left
/// waits (yielding, at most [`WAIT_MAX`]) until every claimed item is done. On one thread (or
/// one item) the items run in order on the caller. The first error is returned: the thread that
/// met it runs none of the items it claims after it (other threads finish the items they run);
/// on one thread the items after it do not run.
pub(crate) fn share_out<T, F>(items: Vec<T>, f: F) -> Result<()>
where
    T: Send,
    F: Fn(usize, T) -> Result<()> + Sync,
{
    let n = items.len();
    let threads = rayon::current_num_threads().clamp(1, n.max(1));
    if threads == 1 {
        return items
            .into_iter()
            .enumerate()
            .try_for_each(|(i, item)| f(i, item));
    }
    let cells: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    let (next, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    (0..threads)
        .into_par_iter()
        .try_for_each(|_| -> Result<()> {
            let mut result = Ok(());
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                // Each index is claimed once, so the cell is always full and never contended.
                let item = cells[i]
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .take();
                if let Some(item) = item
                    && result.is_ok()
                {
                    result = f(i, item);
                }
                done.fetch_add(1, Ordering::Release);
            }
            let start = Instant::now();
            while done.load(Ordering::Acquire) < n && start.elapsed() < WAIT_MAX {
                std::thread::yield_now();
            }
            result
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ConvError;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
    }

    #[test]
    fn every_item_runs_exactly_once_with_its_index() {
        for threads in 1..=3 {
            for n in [0usize, 1, 2, 3, 7, 64] {
                let mut out = vec![0usize; n];
                pool(threads).install(|| {
                    let slots: Vec<&mut usize> = out.iter_mut().collect();
                    share_out(slots, |i, slot| {
                        *slot += i + 1;
                        Ok(())
                    })
                    .expect("no error")
                });
                let want: Vec<usize> = (1..=n).collect();
                assert_eq!(out, want, "{threads} threads, {n} items");
            }
        }
    }

    #[test]
    fn an_error_is_returned_and_the_threads_leave_together() {
        for threads in 1..=3 {
            let ran = AtomicUsize::new(0);
            let r = pool(threads).install(|| {
                share_out((0..10).collect(), |_, v: usize| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    if v == 4 {
                        Err(ConvError::Unsupported {
                            algo: "test",
                            reason: "item 4".into(),
                        })
                    } else {
                        Ok(())
                    }
                })
            });
            assert!(r.is_err(), "{threads} threads");
            assert!(ran.load(Ordering::Relaxed) >= 5);
        }
        // Both threads of a pool of two run items when the items are long enough for the
        // second to start: the caller does not run all of them alone.
        let who: Vec<Mutex<Vec<usize>>> = (0..2).map(|_| Mutex::new(Vec::new())).collect();
        pool(2).install(|| {
            share_out((0..8).collect(), |i, _: usize| {
                let t = rayon::current_thread_index().expect("in the pool");
                who[t].lock().expect("lock").push(i);
                std::thread::sleep(Duration::from_millis(5));
                Ok(())
            })
            .expect("no error")
        });
        let counts: Vec<usize> = who.iter().map(|w| w.lock().expect("lock").len()).collect();
        assert_eq!(counts.iter().sum::<usize>(), 8);
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
    }
}
