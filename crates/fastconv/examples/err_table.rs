//! Re-measures every entry of `points::TABLE` with the current kernels (the process's core-blas
//! family, `CORE_BLAS_ISA`), at the table's trials and seed, and prints it beside the tabulated
//! value: `cargo run --release -p fastconv --example err_table`. Its output is what `TABLE` and
//! the error table of `docs/ALGORITHMS.md` hold after a change of the transforms' arithmetic.
use fastconv::measure_error;
use fastconv::points::{TABLE, TABLE_SEED, TABLE_TRIALS};
fn main() {
    for e in TABLE {
        let t = e.transform().unwrap();
        let e1 = measure_error(std::slice::from_ref(&t), TABLE_TRIALS, TABLE_SEED).unwrap();
        let e2 = measure_error(&[t.clone(), t], TABLE_TRIALS, TABLE_SEED).unwrap();
        println!(
            "F({},{}) 1-D {:.3e} (table {:.3e}, x{:.2}) 2-D {:.3e} (table {:.3e}, x{:.2})",
            e.m,
            e.r,
            e1.max_rel,
            e.err_1d,
            e1.max_rel / e.err_1d,
            e2.max_rel,
            e.err_2d,
            e2.max_rel / e.err_2d
        );
    }
}
