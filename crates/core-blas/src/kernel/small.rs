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
//! A with ± *column* pairs and no cheaper row grouping (Winograd's Aᵀ) runs instead in the
//! column-paired form ([`ColPlan`]): every row's accumulators held in registers at once, each
//! pair's `x_k ± x_l` formed once per column chunk (two adds) and each X row read once per chunk.
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
    /// The column-paired form, when it needs fewer multiply-adds than the row groups (then the
    /// body runs it instead of `groups`).
    pub(crate) cols: Option<ColPlan>,
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
            cols: None,
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
        if pairs {
            // The column-paired form replaces the row groups when it needs fewer multiply-adds
            // (Winograd's Aᵀ: no ± row pairs, but ± column pairs).
            plan.cols = ColPlan::new(a, p, q).filter(|c| c.fmas(p) < plan.idx.len());
        }
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

/// Most rows of a column-paired A: its accumulators (`p` rows × 2 vectors on 512 bits) stay in
/// registers.
pub(crate) const COLPAIR_MAX_P: usize = 8;

/// A column-paired A (Winograd's Aᵀ, whose columns for the points ±x are equal up to the sign
/// `(−1)^row`): `y_i = Σ_pairs a_ik (x_k ± x_l) + Σ_singles a_ik x_k`, with `s = x_k + x_l` for the
/// even rows and `d = x_k − x_l` for the odd ones formed once per pair (two adds on the add pipes)
/// instead of two multiply-adds per row. All `p` rows' accumulators are held at once.
#[derive(Clone, Debug)]
pub(crate) struct ColPlan {
    /// X rows `(k, l)` of each pair: `a[i][l] = (−1)^i · a[i][k]`, every `a[i][k]` nonzero.
    pub(crate) pairs: Vec<(usize, usize)>,
    /// `a[i][k]` of pair `j` at `pair_coef[j * COLPAIR_MAX_P + i]` (`i < p`).
    pub(crate) pair_coef: Vec<f32>,
    /// X rows of the other columns that have a nonzero.
    pub(crate) singles: Vec<usize>,
    /// `a[i][k]` of single `j` at `single_coef[j * COLPAIR_MAX_P + i]` (zeros skipped at run time).
    pub(crate) single_coef: Vec<f32>,
}

impl ColPlan {
    /// The column-paired form of a row-major `p × q` A, if it has at least one pair and
    /// `2 <= p <=` [`COLPAIR_MAX_P`].
    pub(crate) fn new(a: &[f32], p: usize, q: usize) -> Option<Self> {
        if !(2..=COLPAIR_MAX_P).contains(&p) {
            return None;
        }
        let at = |i: usize, k: usize| a[i * q + k];
        let full = |k: usize| (0..p).all(|i| at(i, k) != 0.0);
        let mirrors = |k: usize, l: usize| {
            (0..p).all(|i| at(i, l) == if i % 2 == 0 { at(i, k) } else { -at(i, k) })
        };
        let mut plan = ColPlan {
            pairs: Vec::new(),
            pair_coef: Vec::new(),
            singles: Vec::new(),
            single_coef: Vec::new(),
        };
        let mut used = [false; SMALL_MAX];
        for k in 0..q {
            if used[k] {
                continue;
            }
            used[k] = true;
            let partner = full(k)
                .then(|| (k + 1..q).find(|&l| !used[l] && mirrors(k, l)))
                .flatten();
            let mut coef = [0.0f32; COLPAIR_MAX_P];
            for (i, c) in coef.iter_mut().enumerate().take(p) {
                *c = at(i, k);
            }
            if let Some(l) = partner {
                used[l] = true;
                plan.pairs.push((k, l));
                plan.pair_coef.extend_from_slice(&coef);
            } else if coef.iter().any(|&c| c != 0.0) {
                plan.singles.push(k);
                plan.single_coef.extend_from_slice(&coef);
            }
        }
        (!plan.pairs.is_empty()).then_some(plan)
    }

    /// Multiply-adds per output column.
    pub(crate) fn fmas(&self, p: usize) -> usize {
        self.pairs.len() * p + self.single_coef.iter().filter(|&&c| c != 0.0).count()
    }
}

/// One column chunk (`V` vectors at column `c`, or with `n_last = Some(r)`, `V` = 1, the first `r`
/// lanes) of the column-paired product: all `P` rows accumulated in registers, then stored.
///
/// # Safety
/// As [`small_a_body`] for the columns touched; `px` holds each pair's X rows `(k, l)` and `sx`
/// each single's X row, in the plan's order.
#[inline(always)]
unsafe fn colpair_chunk<S: Simd, const P: usize, const V: usize>(
    cp: &ColPlan,
    px: &[(*const f32, *const f32)],
    sx: &[*const f32],
    ys: &[*mut f32],
    c: usize,
    n_last: Option<usize>,
) {
    // SAFETY: the caller vouches for the columns read and written; coefficient indices are
    // below the plan's `COLPAIR_MAX_P` stride (`P <= COLPAIR_MAX_P`).
    unsafe {
        let load = |p: *const f32| match n_last {
            Some(r) => S::load_n(p, r),
            None => S::load(p),
        };
        let mut acc = [[S::zero(); V]; P];
        for (j, &(xk, xl)) in px.iter().enumerate() {
            let (mut s, mut d) = ([S::zero(); V], [S::zero(); V]);
            for v in 0..V {
                let a = load(xk.add(c + v * S::LANES));
                let b = load(xl.add(c + v * S::LANES));
                s[v] = S::add(a, b);
                d[v] = S::sub(a, b);
            }
            let coef = cp.pair_coef.as_ptr().add(j * COLPAIR_MAX_P);
            for (i, row) in acc.iter_mut().enumerate() {
                let w = S::splat(*coef.add(i));
                let src = if i % 2 == 0 { &s } else { &d };
                for v in 0..V {
                    row[v] = S::fma(w, src[v], row[v]);
                }
            }
        }
        for (j, &xk) in sx.iter().enumerate() {
            let mut x = [S::zero(); V];
            for (v, xv) in x.iter_mut().enumerate() {
                *xv = load(xk.add(c + v * S::LANES));
            }
            let coef = cp.single_coef.as_ptr().add(j * COLPAIR_MAX_P);
            for (i, row) in acc.iter_mut().enumerate() {
                let w = *coef.add(i);
                if w != 0.0 {
                    let w = S::splat(w);
                    for v in 0..V {
                        row[v] = S::fma(w, x[v], row[v]);
                    }
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            let y = ys.get_unchecked(i).add(c);
            for (v, &r) in row.iter().enumerate() {
                match n_last {
                    Some(k) => S::store_n(y.add(v * S::LANES), r, k),
                    None => S::store(y.add(v * S::LANES), r),
                }
            }
        }
    }
}

/// The column loops of the column-paired product for `P` rows: chunks of 2 vectors on 16-lane
/// (32-register) families, 1 vector otherwise, then single vectors, then a masked tail.
///
/// # Safety
/// As [`small_a_body`]; `ys.len() == P`.
#[inline(always)]
unsafe fn colpair_columns<S: Simd, const P: usize>(
    cp: &ColPlan,
    xs: &[*const f32],
    ys: &[*mut f32],
    n: usize,
) {
    debug_assert_eq!(ys.len(), P);
    let mut px = [(std::ptr::null::<f32>(), std::ptr::null::<f32>()); SMALL_MAX / 2];
    let mut sx = [std::ptr::null::<f32>(); SMALL_MAX];
    let (np, ns) = (cp.pairs.len(), cp.singles.len());
    for (dst, &(k, l)) in px.iter_mut().zip(&cp.pairs) {
        *dst = (xs[k], xs[l]);
    }
    for (dst, &k) in sx.iter_mut().zip(&cp.singles) {
        *dst = xs[k];
    }
    let (px, sx) = (&px[..np], &sx[..ns]);
    // SAFETY: every access is at a column `< n` of a row the caller vouches for.
    unsafe {
        let mut c = 0;
        if S::LANES >= 16 {
            while c + 2 * S::LANES <= n {
                colpair_chunk::<S, P, 2>(cp, px, sx, ys, c, None);
                c += 2 * S::LANES;
            }
        }
        while c + S::LANES <= n {
            colpair_chunk::<S, P, 1>(cp, px, sx, ys, c, None);
            c += S::LANES;
        }
        if c < n {
            colpair_chunk::<S, P, 1>(cp, px, sx, ys, c, Some(n - c));
        }
    }
}

/// [`colpair_columns`] for the plan's row count.
///
/// # Safety
/// As [`small_a_body`].
#[inline(always)]
unsafe fn colpair<S: Simd>(cp: &ColPlan, xs: &[*const f32], ys: &[*mut f32], n: usize) {
    // SAFETY: the caller's contract; `ColPlan::new` only forms plans of 2..=COLPAIR_MAX_P rows.
    unsafe {
        match ys.len() {
            2 => colpair_columns::<S, 2>(cp, xs, ys, n),
            3 => colpair_columns::<S, 3>(cp, xs, ys, n),
            4 => colpair_columns::<S, 4>(cp, xs, ys, n),
            5 => colpair_columns::<S, 5>(cp, xs, ys, n),
            6 => colpair_columns::<S, 6>(cp, xs, ys, n),
            7 => colpair_columns::<S, 7>(cp, xs, ys, n),
            8 => colpair_columns::<S, 8>(cp, xs, ys, n),
            _ => unreachable!("column-paired plans have 2..=8 rows"),
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
    if let Some(cp) = &plan.cols {
        // SAFETY: the caller's contract.
        unsafe { colpair::<S>(cp, xs, ys, n) };
        return;
    }
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
