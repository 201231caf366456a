//! The small-A row product `Y (p × n) := A (p × q) · X (q × n)` for tiny dense A (`p, q <=
//! SMALL_MAX`), X and Y given as row pointers: a skinny GEMM whose A lives in registers, with no
//! packing (Winograd's transforms Bᵀ, Aᵀ, G applied along one mode of a tensor).
//!
//! A is prepared once ([`Plan`]): its exact-zero coefficients dropped and its rows grouped in
//! twos, each group a flat list of `(X row, coefficient)` terms in two halves with two sets of
//! accumulators that the body updates in lockstep (8 independent FMA chains):
//! - a **pair** of rows with the same nonzero columns and coefficients of equal magnitude (the
//!   ±x points of the Winograd matrices): half `s` holds the terms where the signs agree, half
//!   `d` those where they differ (both with row a's coefficient), and `y_a = s + d`,
//!   `y_b = s − d`: half the multiply-adds;
//! - two unrelated rows: one half each;
//! - a last single row: one half.
//!
//! The body is written once against [`Simd`] and wrapped per ISA like the micro-kernels. Columns
//! are walked in chunks of `CHUNK` vectors, outermost, so the `q` row pieces of X a chunk reads
//! stay in L1; each output row is stored once per chunk. The last `n % LANES` columns use masked
//! loads and stores. A skipped (zero) coefficient contributes nothing even when the X value is
//! infinite or NaN.

use super::Simd;

/// Largest `p` and `q`.
pub(crate) const SMALL_MAX: usize = 16;

/// Vectors per column chunk (per half: 4 accumulators, 8 per group).
const CHUNK: usize = 4;

/// How a group's two accumulator halves become output rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `y[a] = s + d`, `y[b] = s − d`.
    Pair,
    /// `y[a] = first half`, `y[b] = second half`.
    Two,
    /// `y[a] = first half` (the second is empty).
    One,
}

/// Rows `a`, `b` of Y and their terms `terms[t0..t1]` (first half), `terms[t1..t2]` (second).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Group {
    pub(crate) kind: Kind,
    pub(crate) a: usize,
    pub(crate) b: usize,
    pub(crate) t0: usize,
    pub(crate) t1: usize,
    pub(crate) t2: usize,
}

/// A prepared tiny A: row groups and their flat term lists `(X row index, coefficient)`.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) p: usize,
    pub(crate) q: usize,
    pub(crate) groups: Vec<Group>,
    pub(crate) idx: Vec<usize>,
    pub(crate) val: Vec<f32>,
}

impl Plan {
    /// From a row-major `p × q` A (`a.len() >= p * q`, `p, q <= SMALL_MAX`, checked by the caller);
    /// ± row pairs are formed only when `pairs` (otherwise every row sums its terms in column
    /// order, as a plain row product does).
    pub(crate) fn new(a: &[f32], p: usize, q: usize, pairs: bool) -> Self {
        let row = |j: usize| &a[j * q..(j + 1) * q];
        // Rows b that pair with row a: same nonzero columns, equal magnitudes.
        let pairs_with = |ra: &[f32], rb: &[f32]| {
            ra.iter()
                .zip(rb)
                .all(|(&x, &y)| (x == 0.0) == (y == 0.0) && x.abs() == y.abs())
                && ra.iter().any(|&x| x != 0.0)
        };
        let mut plan = Plan {
            p,
            q,
            groups: Vec::with_capacity(p),
            idx: Vec::with_capacity(p * q),
            val: Vec::with_capacity(p * q),
        };
        let mut used = [false; SMALL_MAX];
        let mut single: Option<usize> = None;
        for ja in 0..p {
            if used[ja] {
                continue;
            }
            used[ja] = true;
            let partner =
                (ja + 1..p).find(|&jb| pairs && !used[jb] && pairs_with(row(ja), row(jb)));
            if let Some(jb) = partner {
                used[jb] = true;
                let t0 = plan.idx.len();
                plan.push_terms(row(ja), |i| row(ja)[i] == row(jb)[i]);
                let t1 = plan.idx.len();
                plan.push_terms(row(ja), |i| row(ja)[i] != row(jb)[i]);
                let t2 = plan.idx.len();
                plan.groups.push(Group {
                    kind: Kind::Pair,
                    a: ja,
                    b: jb,
                    t0,
                    t1,
                    t2,
                });
            } else if let Some(js) = single.take() {
                // Two unpaired rows share a group (their halves run in lockstep).
                let t0 = plan.idx.len();
                plan.push_terms(row(js), |_| true);
                let t1 = plan.idx.len();
                plan.push_terms(row(ja), |_| true);
                let t2 = plan.idx.len();
                plan.groups.push(Group {
                    kind: Kind::Two,
                    a: js,
                    b: ja,
                    t0,
                    t1,
                    t2,
                });
            } else {
                single = Some(ja);
            }
        }
        if let Some(js) = single {
            let t0 = plan.idx.len();
            plan.push_terms(row(js), |_| true);
            let t1 = plan.idx.len();
            plan.groups.push(Group {
                kind: Kind::One,
                a: js,
                b: js,
                t0,
                t1,
                t2: t1,
            });
        }
        debug_assert!({
            let mut seen = [false; SMALL_MAX];
            for g in &plan.groups {
                seen[g.a] = true;
                seen[g.b] = true;
            }
            seen[..p].iter().all(|&x| x)
        });
        plan
    }

    /// Append the nonzero coefficients `r[i]` with `keep(i)` as terms.
    fn push_terms(&mut self, r: &[f32], keep: impl Fn(usize) -> bool) {
        for (i, &v) in r.iter().enumerate() {
            if v != 0.0 && keep(i) {
                self.idx.push(i);
                self.val.push(v);
            }
        }
    }
}

/// The two halves' accumulators of one group over `V` vectors at column `c`; with `n_last`
/// = `Some(r)` (`V` = 1) only the first `r` lanes are loaded.
///
/// # Safety
/// As [`small_a_body`], for the columns `c .. c + V · LANES` (or `c .. c + r`).
#[inline(always)]
unsafe fn halves<S: Simd, const V: usize, X: Fn(usize) -> *const f32>(
    plan: &Plan,
    g: &Group,
    xrow: &X,
    c: usize,
    n_last: Option<usize>,
) -> ([S::V; V], [S::V; V]) {
    // SAFETY: `xrow(t)` is the X row of term `t` (see `small_a_body`), and the caller vouches for
    // the columns read.
    unsafe {
        let load = |p: *const f32| match n_last {
            Some(r) => S::load_n(p, r),
            None => S::load(p),
        };
        let (mut s, mut d) = ([S::zero(); V], [S::zero(); V]);
        let (la, lb) = (g.t1 - g.t0, g.t2 - g.t1);
        let both = la.min(lb);
        for t in 0..both {
            let (ta, tb) = (g.t0 + t, g.t1 + t);
            let (va, vb) = (
                S::splat(*plan.val.get_unchecked(ta)),
                S::splat(*plan.val.get_unchecked(tb)),
            );
            let xa = xrow(ta).add(c);
            let xb = xrow(tb).add(c);
            for v in 0..V {
                s[v] = S::fma(va, load(xa.add(v * S::LANES)), s[v]);
                d[v] = S::fma(vb, load(xb.add(v * S::LANES)), d[v]);
            }
        }
        for t in g.t0 + both..g.t1 {
            let va = S::splat(*plan.val.get_unchecked(t));
            let xa = xrow(t).add(c);
            for v in 0..V {
                s[v] = S::fma(va, load(xa.add(v * S::LANES)), s[v]);
            }
        }
        for t in g.t1 + both..g.t2 {
            let vb = S::splat(*plan.val.get_unchecked(t));
            let xb = xrow(t).add(c);
            for v in 0..V {
                d[v] = S::fma(vb, load(xb.add(v * S::LANES)), d[v]);
            }
        }
        (s, d)
    }
}

/// Store one group's rows for `V` vectors at column `c` (`n_last` as in [`halves`]).
///
/// # Safety
/// As [`small_a_body`].
#[inline(always)]
unsafe fn store_group<S: Simd, const V: usize>(
    g: &Group,
    ys: &[*mut f32],
    c: usize,
    (s, d): ([S::V; V], [S::V; V]),
    n_last: Option<usize>,
) {
    // SAFETY: rows a, b < p = ys.len(); the caller vouches for the columns written.
    unsafe {
        let store = |p: *mut f32, x: S::V| match n_last {
            Some(r) => S::store_n(p, x, r),
            None => S::store(p, x),
        };
        let ya = ys.get_unchecked(g.a).add(c);
        let yb = ys.get_unchecked(g.b).add(c);
        for v in 0..V {
            match g.kind {
                Kind::Pair => {
                    store(ya.add(v * S::LANES), S::add(s[v], d[v]));
                    store(yb.add(v * S::LANES), S::sub(s[v], d[v]));
                }
                Kind::Two => {
                    store(ya.add(v * S::LANES), s[v]);
                    store(yb.add(v * S::LANES), d[v]);
                }
                Kind::One => store(ya.add(v * S::LANES), s[v]),
            }
        }
    }
}

/// `Y := A · X` with A prepared as `plan`: `y[j][c]` for `j < p = ys.len()`, `c < n`.
///
/// # Safety
/// `xs.len() == plan.q`, `ys.len() == plan.p`; every `xs[i]` points to `n` readable f32, every
/// `ys[j]` to `n` writable f32 that no `xs` row and no other `ys` row overlaps; the caller is
/// compiled with `S`'s target features.
#[inline(always)]
pub(crate) unsafe fn small_a_body<S: Simd>(
    plan: &Plan,
    xs: &[*const f32],
    ys: &[*mut f32],
    n: usize,
) {
    debug_assert!(xs.len() == plan.q && ys.len() == plan.p);
    // SAFETY: every X row index in the plan is < q = xs.len() (built from a q-column A).
    let lookup = |t: usize| unsafe { *xs.get_unchecked(*plan.idx.get_unchecked(t)) };
    if n < TABLE_MIN_N {
        // SAFETY: the caller's contract.
        unsafe { columns::<S, _>(plan, &lookup, ys, n) };
        return;
    }
    // Long rows: each term's X row pointer resolved once per call instead of once per term and
    // chunk (one dependent load less in the inner loop; 5-15% on n >= 400, 23:48 UTC).
    let nt = plan.idx.len();
    debug_assert!(nt <= SMALL_MAX * SMALL_MAX);
    // Not zeroed (2 KiB per call): only the first `nt` slots are written and read.
    let mut table = [std::mem::MaybeUninit::<*const f32>::uninit(); SMALL_MAX * SMALL_MAX];
    for (t, slot) in table.iter_mut().enumerate().take(nt) {
        *slot = std::mem::MaybeUninit::new(lookup(t));
    }
    // SAFETY: `table[t]` was initialised to term t's X row for every t < nt (the terms the plan
    // reads); the caller's contract for the rest.
    unsafe {
        columns::<S, _>(
            plan,
            &|t: usize| table.get_unchecked(t).assume_init(),
            ys,
            n,
        )
    };
}

/// Rows of at least this many columns look their terms' X rows up once per call.
const TABLE_MIN_N: usize = 128;

/// The column loops of [`small_a_body`], with term `t`'s X row given by `xrow(t)`.
///
/// # Safety
/// As [`small_a_body`]; `xrow(t)` is the X row of term `t` for every term of the plan.
#[inline(always)]
unsafe fn columns<S: Simd, X: Fn(usize) -> *const f32>(
    plan: &Plan,
    xrow: &X,
    ys: &[*mut f32],
    n: usize,
) {
    let step = CHUNK * S::LANES;
    // SAFETY: every access below is at a column `< n` of a row the caller vouches for.
    unsafe {
        let mut c = 0;
        while c + step <= n {
            for g in &plan.groups {
                let h = halves::<S, CHUNK, X>(plan, g, xrow, c, None);
                store_group::<S, CHUNK>(g, ys, c, h, None);
            }
            c += step;
        }
        while c + S::LANES <= n {
            for g in &plan.groups {
                let h = halves::<S, 1, X>(plan, g, xrow, c, None);
                store_group::<S, 1>(g, ys, c, h, None);
            }
            c += S::LANES;
        }
        if c < n {
            let r = Some(n - c);
            for g in &plan.groups {
                let h = halves::<S, 1, X>(plan, g, xrow, c, r);
                store_group::<S, 1>(g, ys, c, h, r);
            }
        }
    }
}
