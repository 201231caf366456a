//! A tour of what the framework runs on this machine: the kernel family and threads, the FMA
//! peak, the GEMM against it, then every convolution algorithm of every training pass (conv-ops'
//! GEMM-based ones and fastconv's Winograd) on a ResNet-50 layer — checked against the naive
//! reference on a small layer first — with time, GFLOP/s and the workspace each needs.
//!
//! `cargo run --release -p examples --bin demo [-- --threads 2 --layer r50_3x3_c128_28]`

use std::time::Duration;

use clap::Parser;
use conv_ops::testing::{Tolerance, uniform};
use conv_ops::{
    BackwardDataAlgo, BackwardFilterAlgo, ConvGeometry, ForwardAlgo, Pass, Workspace,
    backward_data, backward_filter, forward, reference, workspace_bytes,
};
use examples::{human_bytes, median_time, peak_rss_bytes};
use fastconv::WinogradPlan;

/// Demonstrate the kernels and convolution algorithms on this machine.
#[derive(Parser, Debug)]
struct Args {
    /// Threads (rayon pool size); default: all cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Layer: r50_3x3_c64_56, r50_3x3_c128_28, r50_3x3_c256_14, r50_3x3_c512_7, c3d_64_8x28x28.
    #[arg(long, default_value = "r50_3x3_c128_28")]
    layer: String,
    /// Timed runs per case (median reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// A pass computed by a conv-ops algorithm or by fastconv's Winograd plan.
#[derive(Clone, Copy)]
enum Algo {
    Conv(Pass),
    /// 0: forward, 1: backward-data, 2: backward-filter.
    Winograd(u8),
}

const ALGOS: [(Algo, &str); 11] = [
    (
        Algo::Conv(Pass::Forward(ForwardAlgo::Im2colGemm)),
        "forward         im2col + GEMM (base)",
    ),
    (
        Algo::Conv(Pass::Forward(ForwardAlgo::Convgemm)),
        "forward         convgemm",
    ),
    (Algo::Winograd(0), "forward         Winograd"),
    (
        Algo::Conv(Pass::BackwardData(BackwardDataAlgo::GemmCol2im)),
        "backward-data   GEMM + col2im (base)",
    ),
    (
        Algo::Conv(Pass::BackwardData(BackwardDataAlgo::Deconvgemm)),
        "backward-data   deconvgemm",
    ),
    (
        Algo::Conv(Pass::BackwardData(BackwardDataAlgo::FlippedConvgemm)),
        "backward-data   flipped convgemm",
    ),
    (Algo::Winograd(1), "backward-data   Winograd"),
    (
        Algo::Conv(Pass::BackwardFilter(BackwardFilterAlgo::Im2colGemmT)),
        "backward-filter im2col + GEMMᵀ (base)",
    ),
    (
        Algo::Conv(Pass::BackwardFilter(BackwardFilterAlgo::ReindexConvgemm)),
        "backward-filter Reindex + convgemm",
    ),
    (
        Algo::Conv(Pass::BackwardFilter(BackwardFilterAlgo::ConvgemmTrans)),
        "backward-filter transposed convgemm",
    ),
    (Algo::Winograd(2), "backward-filter Winograd"),
];

/// Workspace bytes of an algorithm beyond its inputs and outputs, where it is known exactly.
fn workspace(g: &ConvGeometry, algo: Algo) -> String {
    match algo {
        Algo::Conv(p) => human_bytes(workspace_bytes(g, p) as u64),
        Algo::Winograd(_) => "tile blocks".to_string(),
    }
}

struct Buffers {
    x: Vec<f32>,
    w: Vec<f32>,
    dy: Vec<f32>,
    y: Vec<f32>,
    dx: Vec<f32>,
    dw: Vec<f32>,
}

impl Buffers {
    fn new(g: &ConvGeometry) -> Self {
        Buffers {
            x: uniform(1, g.x_len()),
            w: uniform(2, g.w_len()),
            dy: uniform(3, g.y_len()),
            y: vec![0.0; g.y_len()],
            dx: vec![0.0; g.x_len()],
            dw: vec![0.0; g.w_len()],
        }
    }
    fn run(
        &mut self,
        g: &ConvGeometry,
        algo: Algo,
        ws: &mut Workspace,
        plan: &mut WinogradPlan,
    ) -> Result<(), Box<dyn std::error::Error>> {
        match algo {
            Algo::Conv(Pass::Forward(a)) => {
                forward(g, &self.x, &self.w, None, false, &mut self.y, a, ws)?
            }
            Algo::Conv(Pass::BackwardData(a)) => {
                backward_data(g, &self.dy, &self.w, &mut self.dx, a, ws)?
            }
            Algo::Conv(Pass::BackwardFilter(a)) => {
                backward_filter(g, &self.x, &self.dy, &mut self.dw, a, ws)?
            }
            Algo::Winograd(0) => plan.forward(&self.x, &self.w, &mut self.y)?,
            Algo::Winograd(1) => plan.backward_data(&self.dy, &self.w, &mut self.dx)?,
            Algo::Winograd(_) => plan.backward_filter(&self.x, &self.dy, &mut self.dw)?,
        }
        Ok(())
    }
    /// The result of `algo` and the reference's.
    fn result_and_reference(&self, g: &ConvGeometry, algo: Algo) -> (Vec<f32>, Vec<f32>) {
        let kind = match algo {
            Algo::Conv(Pass::Forward(_)) | Algo::Winograd(0) => 0,
            Algo::Conv(Pass::BackwardData(_)) | Algo::Winograd(1) => 1,
            _ => 2,
        };
        match kind {
            0 => {
                let mut r = vec![0.0; g.y_len()];
                reference::forward(g, &self.x, &self.w, None, &mut r).expect("reference");
                (self.y.clone(), r)
            }
            1 => {
                let mut r = vec![0.0; g.x_len()];
                reference::backward_data(g, &self.dy, &self.w, &mut r).expect("reference");
                (self.dx.clone(), r)
            }
            _ => {
                let mut r = vec![0.0; g.w_len()];
                reference::backward_filter(g, &self.x, &self.dy, &mut r).expect("reference");
                (self.dw.clone(), r)
            }
        }
    }
}

fn layer(name: &str) -> Result<ConvGeometry, String> {
    let g = match name {
        "r50_3x3_c64_56" => ConvGeometry::new(8, 64, 64, &[56, 56], &[3, 3]),
        "r50_3x3_c128_28" => ConvGeometry::new(8, 128, 128, &[28, 28], &[3, 3]),
        "r50_3x3_c256_14" => ConvGeometry::new(8, 256, 256, &[14, 14], &[3, 3]),
        "r50_3x3_c512_7" => ConvGeometry::new(8, 512, 512, &[7, 7], &[3, 3]),
        "c3d_64_8x28x28" => ConvGeometry::new(1, 64, 64, &[8, 28, 28], &[3, 3, 3]),
        other => return Err(format!("unknown layer `{other}`")),
    };
    g.and_then(|g| g.with_padding(&[1]))
        .map_err(|e| e.to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if let Some(t) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()?;
    }
    let threads = rayon::current_num_threads();
    let gemm = core_blas::Gemm::global()?;
    let (mr, nr) = gemm.tile();
    println!("== machine");
    println!(
        "kernel family   {} ({}, micro-tile {mr}×{nr})",
        gemm.isa().name(),
        gemm.kernel_name()
    );
    println!(
        "available       {:?}",
        core_blas::Isa::available()
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
    );
    println!("threads         {threads}");
    let peak = core_blas::peak::fma_peak_gflops(gemm.isa(), threads, Duration::from_millis(300))?;
    println!("FMA peak        {peak:.1} GFLOP/s (measured now, {threads} thread(s))");

    println!("\n== GEMM (C = A·B, f32, row-major)");
    for &(m, n, k) in &[(1024, 1024, 1024), (256, 3136, 2304), (64, 50176, 576)] {
        let (a, b) = (uniform(4, m * k), uniform(5, k * n));
        let mut c = vec![0f32; m * n];
        let t = median_time(args.runs, || {
            core_blas::sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)
        })?;
        let gf = 2.0 * (m * n * k) as f64 / t.as_secs_f64() / 1e9;
        println!(
            "{m:>5}×{n:<5}×{k:<5} {:>8.2} ms {gf:>7.1} GFLOP/s  {:>4.0}% of peak",
            t.as_secs_f64() * 1e3,
            100.0 * gf / peak
        );
    }

    println!("\n== convolution algorithms, checked against the naive reference");
    // Winograd needs stride 1: the small check layer is stride 1, odd-sized and padded.
    let small = ConvGeometry::new(2, 6, 5, &[9, 11], &[3, 3])?.with_padding(&[1])?;
    let mut plan = WinogradPlan::new(&small, None)?;
    let mut bufs = Buffers::new(&small);
    for (algo, name) in ALGOS {
        let mut ws = Workspace::new(false);
        bufs.run(&small, algo, &mut ws, &mut plan)?;
        let (got, want) = bufs.result_and_reference(&small, algo);
        let verdict = match Tolerance::for_f32_sum(small.batch() * 121).check("result", &got, &want)
        {
            Ok(()) => "matches".to_string(),
            Err(e) => format!("MISMATCH: {e}"),
        };
        println!("{name:<40} {verdict}");
    }

    let g = layer(&args.layer)?;
    let gflop = g.flops() as f64 / 1e9;
    println!(
        "\n== {} (N={} C={} K={} {:?}, kernel {:?}, {gflop:.2} GFLOP per pass)",
        args.layer,
        g.batch(),
        g.in_channels(),
        g.out_channels(),
        g.input(),
        g.kernel()
    );
    let mut plan = WinogradPlan::new(&g, None)?;
    println!(
        "Winograd tile   F({:?}, {:?}) forward/backward-data, filter tile {:?}",
        plan.tile(),
        g.kernel(),
        plan.filter_tile()
    );
    println!("GFLOP/s counts direct-convolution work (Winograd does fewer multiplies).");
    println!(
        "{:<40} {:>9} {:>9} {:>7} {:>12}",
        "pass / algorithm", "ms", "GFLOP/s", "% peak", "workspace"
    );
    let mut bufs = Buffers::new(&g);
    for (algo, name) in ALGOS {
        let mut ws = Workspace::new(false);
        let t = median_time(args.runs, || bufs.run(&g, algo, &mut ws, &mut plan))?;
        let rate = gflop / t.as_secs_f64();
        println!(
            "{name:<40} {:>9.2} {rate:>9.1} {:>6.0}% {:>12}",
            t.as_secs_f64() * 1e3,
            100.0 * rate / peak,
            workspace(&g, algo)
        );
    }
    if let Some(rss) = peak_rss_bytes() {
        println!(
            "\npeak resident memory of this process: {}",
            human_bytes(rss)
        );
    }
    Ok(())
}
