//! `Auto`'s measured choices in a file, so that another run makes the same choices without
//! measuring again: a resumed run (which then repeats the interrupted one's arithmetic), the
//! ranks of a distributed run, a sweep over hyper-parameters. PyTorch's TunableOp keeps its
//! results file the same way, and likewise discards it when it was written for other kernels.
//!
//! The file is text, one choice per line, keyed like the process-wide cache of
//! [`ConvAlgo::Auto`] by the whole convolution geometry and the rayon
//! thread count:
//!
//! ```text
//! # nn auto-tuning choices
//! format=2 kernels=avx2-f32-6x16
//! # measured ms (fastest run): forward: direct 9.811, convgemm 12.104; data: flipped-direct 10.2, ...
//! threads=1 batch=8 in=64 out=64 input=56x56 kernel=3x3 stride=1x1 dilation=1x1 pad=1x1/1x1 groups=1 algo=winograd forward=direct data=flipped-direct filter=convgemm-trans
//! ```
//!
//! The comment above a choice that this process measured lists each candidate's fastest run,
//! by pass (Winograd's covers its three passes); [`load`] skips comments.
//!
//! `forward`, `data` and `filter` are the algorithms of the three passes when `algo` is
//! convgemm (conv-ops' memory-lean forms; Winograd keeps them for the process's other uses of
//! the geometry). Format 1 (before `forward` and `filter`) is still read: its passes other
//! than `data` take conv-ops' rule ([`conv_ops::Preset::lean_for`]).
//!
//! ```
//! # fn main() -> nn::Result<()> {
//! let path = std::env::temp_dir().join(format!("nn-tuning-doc-{}.txt", std::process::id()));
//! // After the first training step of an `Auto` model, the process knows its choices:
//! let saved = nn::tuning::save(&path)?;
//! // ... and a later process loads them before its first step.
//! let loaded = nn::tuning::load(&path)?;
//! assert_eq!(loaded, nn::tuning::Loaded::Choices(saved));
//! # std::fs::remove_file(&path).unwrap();
//! # Ok(())
//! # }
//! ```

use std::fs;
use std::path::Path;

use conv_ops::{BackwardDataAlgo, BackwardFilterAlgo, ConvGeometry, ForwardAlgo, Preset};

use crate::checkpoint::write_atomic;
use crate::error::{NnError, Result};
use crate::layers::ConvAlgo;
use crate::layers::conv::{Pass, convgemm_preset, measured_choices, measured_times, record_choice};

/// The first line of a tuning file.
const HEADER: &str = "# nn auto-tuning choices";

/// The version of the line format (2: `forward=` and `filter=`).
const FORMAT: u32 = 2;

/// The oldest format [`load`] reads.
const OLDEST_FORMAT: u32 = 1;

/// What [`load`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// This many choices were added to the process's cache (choices it had already measured
    /// are kept).
    Choices(usize),
    /// The file was written for other GEMM kernels (another CPU, or `CORE_BLAS_ISA`): its
    /// timings say nothing here, so nothing was loaded and `Auto` measures again.
    Stale {
        /// The kernels the file was written for.
        file: String,
        /// The kernels of this process.
        here: String,
    },
}

/// Writes every choice `Auto` measured (or loaded) in this process to `path`, replacing the
/// file atomically (a temporary file renamed over it, as checkpoints are). Returns how many
/// choices it holds.
///
/// Errors: [`NnError::Io`] naming the file; [`NnError::Gemm`] if no GEMM kernel can run.
pub fn save(path: &Path) -> Result<usize> {
    let mut entries: Vec<(String, String)> = measured_choices()
        .into_iter()
        .map(|(geom, threads, algo, preset)| {
            let entry = format_entry(&geom, threads, algo, &preset);
            (entry, format_times(&measured_times(&geom, threads)))
        })
        .collect();
    entries.sort();
    let mut text = format!("{HEADER}\nformat={FORMAT} kernels={}\n", kernels()?);
    for (entry, times) in &entries {
        text.push_str(times);
        text.push_str(entry);
        text.push('\n');
    }
    write_atomic(path, text.as_bytes())?;
    Ok(entries.len())
}

/// Reads a file written by [`save`] into the process's cache of `Auto` choices, so layers of
/// those geometries (at those thread counts) take the file's choice instead of measuring. A
/// file written for other GEMM kernels is ignored ([`Loaded::Stale`]).
///
/// Errors: [`NnError::Io`] when the file cannot be read; [`NnError::Tuning`] naming the file and
/// line when a line is malformed or names a choice that cannot run its geometry (nothing is
/// loaded then).
pub fn load(path: &Path) -> Result<Loaded> {
    let text = fs::read_to_string(path).map_err(|e| NnError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let bad = |line: usize, detail: String| NnError::Tuning {
        path: path.to_path_buf(),
        line,
        detail,
    };
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
    match lines.next() {
        Some((_, HEADER)) => {}
        _ => return Err(bad(1, format!("expected `{HEADER}`: not a tuning file"))),
    }
    let (n, meta) = lines
        .next()
        .ok_or_else(|| bad(2, "missing the `format=... kernels=...` line".into()))?;
    let fields = Fields::parse(meta).map_err(|d| bad(n, d))?;
    let format: u32 = fields.number("format").map_err(|d| bad(n, d))?;
    if !(OLDEST_FORMAT..=FORMAT).contains(&format) {
        return Err(bad(
            n,
            format!("format {format}, this version reads {OLDEST_FORMAT} to {FORMAT}"),
        ));
    }
    let file = fields.text("kernels").map_err(|d| bad(n, d))?.to_string();
    let here = kernels()?.to_string();
    if file != here {
        return Ok(Loaded::Stale { file, here });
    }
    let mut parsed = Vec::new();
    for (n, line) in lines {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        parsed.push(parse_entry(line).map_err(|d| bad(n, d))?);
    }
    let mut added = 0;
    for (geom, threads, algo, preset) in parsed {
        added += usize::from(record_choice(geom, threads, algo, preset));
    }
    Ok(Loaded::Choices(added))
}

/// The GEMM kernels in use: the validator of a tuning file.
fn kernels() -> Result<&'static str> {
    Ok(core_blas::Gemm::global()?.kernel_name())
}

/// `4x5x6`.
fn dims(v: &[usize]) -> String {
    v.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

/// The file's name of a data-gradient algorithm.
fn data_name(a: BackwardDataAlgo) -> &'static str {
    match a {
        BackwardDataAlgo::GemmCol2im => "gemm-col2im",
        BackwardDataAlgo::Deconvgemm => "deconvgemm",
        BackwardDataAlgo::FlippedConvgemm => "flipped-convgemm",
        BackwardDataAlgo::FlippedDirect => "flipped-direct",
    }
}

/// The file's name of a forward algorithm (conv-ops' memory-lean ones).
fn forward_name(a: ForwardAlgo) -> &'static str {
    match a {
        ForwardAlgo::Convgemm => "convgemm",
        ForwardAlgo::Direct => "direct",
        ForwardAlgo::Im2colGemm => "im2col",
    }
}

/// The forward algorithms a file may name.
const FORWARD_ALGOS: [ForwardAlgo; 2] = [ForwardAlgo::Convgemm, ForwardAlgo::Direct];

/// The file's name of a weight-gradient algorithm.
fn filter_name(a: BackwardFilterAlgo) -> &'static str {
    match a {
        BackwardFilterAlgo::ConvgemmTrans => "convgemm-trans",
        BackwardFilterAlgo::Direct => "direct",
        BackwardFilterAlgo::Im2colGemmT => "im2col",
        BackwardFilterAlgo::ReindexConvgemm => "reindex",
    }
}

/// The weight-gradient algorithms a file may name.
const FILTER_ALGOS: [BackwardFilterAlgo; 2] = [
    BackwardFilterAlgo::ConvgemmTrans,
    BackwardFilterAlgo::Direct,
];

/// The algorithm of `all` that `name` names in the file, or an error listing the names.
fn named<A: Copy>(
    key: &str,
    value: &str,
    all: &[A],
    name: impl Fn(A) -> &'static str,
) -> Result<A, String> {
    all.iter()
        .copied()
        .find(|&a| name(a) == value)
        .ok_or_else(|| {
            let names: Vec<_> = all.iter().map(|&a| name(a)).collect();
            format!("`{key}={value}` is not one of {}", names.join(", "))
        })
}

/// Every data-gradient algorithm, in the order the file format lists them.
const DATA_ALGOS: [BackwardDataAlgo; 4] = [
    BackwardDataAlgo::GemmCol2im,
    BackwardDataAlgo::Deconvgemm,
    BackwardDataAlgo::FlippedConvgemm,
    BackwardDataAlgo::FlippedDirect,
];

/// `3x3` as sizes; `None` unless every part is a non-negative integer.
fn parse_sizes(v: &str) -> Option<Vec<usize>> {
    v.split('x').map(|d| d.parse().ok()).collect()
}

fn format_entry(g: &ConvGeometry, threads: usize, algo: ConvAlgo, preset: &Preset) -> String {
    format!(
        "threads={threads} batch={} in={} out={} input={} kernel={} stride={} dilation={} \
         pad={}/{} groups={} algo={algo} forward={} data={} filter={}",
        g.batch(),
        g.in_channels(),
        g.out_channels(),
        dims(g.input()),
        dims(g.kernel()),
        dims(g.stride()),
        dims(g.dilation()),
        dims(g.pad_before()),
        dims(g.pad_after()),
        g.groups(),
        forward_name(preset.forward),
        data_name(preset.backward_data),
        filter_name(preset.backward_filter),
    )
}

/// The comment line (with its newline) that shows the timings behind a measured choice: each
/// candidate's fastest run in milliseconds, by pass; empty for a choice that was loaded.
fn format_times(times: &[(Pass, f64)]) -> String {
    if times.is_empty() {
        return String::new();
    }
    let mut parts: Vec<String> = Vec::new();
    for (label, of_pass) in [("forward", 0), ("data", 1), ("filter", 2), ("winograd", 3)] {
        let algos: Vec<String> = times
            .iter()
            .filter_map(|&(p, t)| {
                let (pass, name) = match p {
                    Pass::Forward(a) => (0, forward_name(a)),
                    Pass::Data(a) => (1, data_name(a)),
                    Pass::Filter(a) => (2, filter_name(a)),
                    Pass::Winograd => (3, "all three passes"),
                };
                (pass == of_pass).then(|| format!("{name} {:.3}", t * 1e3))
            })
            .collect();
        if !algos.is_empty() {
            parts.push(format!("{label}: {}", algos.join(", ")));
        }
    }
    format!("# measured ms (fastest run): {}\n", parts.join("; "))
}

/// The `key=value` fields of a line, each key once.
struct Fields<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Fields<'a> {
    fn parse(line: &'a str) -> Result<Self, String> {
        let mut fields: Vec<(&str, &str)> = Vec::new();
        for word in line.split_whitespace() {
            let (k, v) = word
                .split_once('=')
                .ok_or_else(|| format!("`{word}` is not key=value"))?;
            if fields.iter().any(|&(k2, _)| k2 == k) {
                return Err(format!("`{k}` given twice"));
            }
            fields.push((k, v));
        }
        Ok(Fields(fields))
    }

    fn text(&self, key: &str) -> Result<&'a str, String> {
        self.0
            .iter()
            .find(|&&(k, _)| k == key)
            .map(|&(_, v)| v)
            .ok_or_else(|| format!("`{key}=` is missing"))
    }

    fn number<T: std::str::FromStr>(&self, key: &str) -> Result<T, String> {
        let v = self.text(key)?;
        v.parse()
            .map_err(|_| format!("`{key}={v}` is not a non-negative integer"))
    }

    fn dims(&self, key: &str) -> Result<Vec<usize>, String> {
        let v = self.text(key)?;
        parse_sizes(v).ok_or_else(|| format!("`{key}={v}` is not a list of sizes like 3x3"))
    }
}

/// One line's choice; `forward=` and `filter=` may be missing (format 1): conv-ops' rule then.
fn parse_entry(line: &str) -> Result<(ConvGeometry, usize, ConvAlgo, Preset), String> {
    let f = Fields::parse(line)?;
    let threads: usize = f.number("threads")?;
    if threads == 0 {
        return Err("`threads=0`: at least 1".into());
    }
    let pad = f.text("pad")?;
    let (before, after) = pad
        .split_once('/')
        .ok_or_else(|| format!("`pad={pad}` is not before/after, like 1x1/1x1"))?;
    let sizes = |what: &str, v: &str| {
        parse_sizes(v).ok_or_else(|| format!("`pad={pad}`: {what} `{v}` is not a list of sizes"))
    };
    let geom = ConvGeometry::from_parts(
        f.number("batch")?,
        f.number("in")?,
        f.number("out")?,
        &f.dims("input")?,
        &f.dims("kernel")?,
        &f.dims("stride")?,
        &f.dims("dilation")?,
        &sizes("before", before)?,
        &sizes("after", after)?,
        f.number("groups")?,
    )
    .map_err(|e| format!("invalid geometry: {e}"))?;
    let algo_name = f.text("algo")?;
    let algo: ConvAlgo = algo_name
        .parse()
        .map_err(|_| format!("`algo={algo_name}` is not an algorithm"))?;
    let data = named("data", f.text("data")?, &DATA_ALGOS, data_name)?;
    if let Some((k, _)) = f.0.iter().find(|(k, _)| {
        ![
            "threads", "batch", "in", "out", "input", "kernel", "stride", "dilation", "pad",
            "groups", "algo", "forward", "data", "filter",
        ]
        .contains(k)
    }) {
        return Err(format!("unknown field `{k}`"));
    }
    crate::layers::conv::check_choice(&geom, algo, data)?;
    let mut preset = convgemm_preset(&geom);
    preset.backward_data = data;
    if let Ok(v) = f.text("forward") {
        preset.forward = named("forward", v, &FORWARD_ALGOS, forward_name)?;
    }
    if let Ok(v) = f.text("filter") {
        preset.backward_filter = named("filter", v, &FILTER_ALGOS, filter_name)?;
    }
    Ok((geom, threads, algo, preset))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use crate::layer::Layer;
    use crate::layers::{Conv, ConvConfig};
    use crate::tensor::Tensor;

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("nn-tuning-{name}-{}.txt", std::process::id()))
    }

    fn header(kernels: &str) -> String {
        format!("{HEADER}\nformat={FORMAT} kernels={kernels}\n")
    }

    /// The entry of a 2D geometry no other test uses, `c → k` channels on `h × w`, 3×3, pad 1,
    /// with the convgemm forward and the direct weight gradient.
    fn line(c: usize, k: usize, h: usize, w: usize, algo: &str, data: &str) -> String {
        format!(
            "threads={} batch=2 in={c} out={k} input={h}x{w} kernel=3x3 stride=1x1 dilation=1x1 \
             pad=1x1/1x1 groups=1 algo={algo} forward=convgemm data={data} filter=direct\n",
            rayon::current_num_threads()
        )
    }

    /// A loaded choice is what the layer runs, and the layer does not measure (its lookup is a
    /// hit on the loaded entry); each of the two choices is taken, whatever timing would say.
    #[test]
    fn loaded_choices_are_taken_without_measuring() {
        let path = temp("taken");
        let k = kernels().unwrap();
        let text = header(k)
            + &line(5, 9, 11, 7, "convgemm", "deconvgemm")
            + &line(9, 5, 11, 7, "winograd", "flipped-convgemm");
        fs::write(&path, text).unwrap();
        assert_eq!(load(&path).unwrap(), Loaded::Choices(2));
        // Loading again adds nothing: the process has them.
        assert_eq!(load(&path).unwrap(), Loaded::Choices(0));
        let rng = &mut SmallRng::seed_from_u64(5);
        for (c, k, algo, data) in [
            (5, 9, ConvAlgo::Convgemm, Some(BackwardDataAlgo::Deconvgemm)),
            (9, 5, ConvAlgo::Winograd, None),
        ] {
            let cfg = ConvConfig::conv2d(c, k, 3).padding(1);
            let mut conv = Conv::new(cfg, ConvAlgo::Auto, rng).unwrap();
            let x = Tensor::new(&[2, c, 11, 7], vec![0.25; 2 * c * 77]).unwrap();
            conv.forward(x, false).unwrap();
            assert_eq!(conv.algorithm_in_use(), Some(algo));
            assert_eq!(conv.preset_in_use().map(|p| p.backward_data), data);
            if data.is_some() {
                let p = conv.preset_in_use().unwrap();
                assert_eq!(
                    (p.forward, p.backward_filter),
                    (ForwardAlgo::Convgemm, BackwardFilterAlgo::Direct)
                );
            }
            let geom = measured_choices()
                .into_iter()
                .find(|(g, ..)| {
                    g.in_channels() == c && g.out_channels() == k && g.input() == [11, 7]
                })
                .unwrap()
                .0;
            assert_eq!(
                crate::layers::conv::hits(&geom, rayon::current_num_threads()),
                Some(1),
                "{c}→{k}: the layer found the loaded choice"
            );
        }
        // Saved again, the file holds them (among whatever else this process measured).
        let saved = save(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        // The header, the format line and the entries; other tests' measured choices bring
        // comments with their times.
        let entries = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(entries, saved + 1, "{text}");
        assert!(
            text.contains(&line(5, 9, 11, 7, "convgemm", "deconvgemm")),
            "{text}"
        );
        assert!(
            text.contains(&line(9, 5, 11, 7, "winograd", "flipped-convgemm")),
            "{text}"
        );
        assert_eq!(load(&path).unwrap(), Loaded::Choices(0));
        fs::remove_file(&path).unwrap();
    }

    /// A measured choice is saved under a comment with every candidate's time, by pass; the
    /// file loads.
    #[test]
    fn measured_choices_are_saved_with_their_times() {
        let path = temp("times");
        let rng = &mut SmallRng::seed_from_u64(6);
        let cfg = ConvConfig::conv2d(7, 3, 3).padding(1);
        let mut conv = Conv::new(cfg, ConvAlgo::Auto, rng).unwrap();
        let x = Tensor::new(&[2, 7, 9, 13], vec![0.5; 2 * 7 * 117]).unwrap();
        conv.forward(x, false).unwrap();
        save(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.contains(" in=7 out=3 input=9x13 "))
            .unwrap();
        let times = lines[at - 1];
        assert!(
            times.starts_with("# measured ms (fastest run): forward: "),
            "{times}"
        );
        for part in [
            "convgemm ",
            "; data: ",
            "; filter: ",
            "convgemm-trans ",
            "; winograd: ",
        ] {
            assert!(times.contains(part), "{part} in {times}");
        }
        // Every candidate's time is a positive number of milliseconds.
        for word in times.split([',', ';']) {
            let ms: f64 = word.trim().rsplit(' ').next().unwrap().parse().unwrap();
            assert!(ms > 0.0, "{word} in {times}");
        }
        assert_eq!(load(&path).unwrap(), Loaded::Choices(0));
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn another_machines_file_is_stale() {
        let path = temp("stale");
        fs::write(
            &path,
            header("neon-f32-8x12") + &line(3, 4, 6, 6, "winograd", "deconvgemm"),
        )
        .unwrap();
        assert_eq!(
            load(&path).unwrap(),
            Loaded::Stale {
                file: "neon-f32-8x12".into(),
                here: kernels().unwrap().into()
            }
        );
        assert!(
            !measured_choices()
                .iter()
                .any(|(g, ..)| g.in_channels() == 3 && g.input() == [6, 6]),
            "nothing loaded"
        );
        fs::remove_file(&path).unwrap();
    }

    /// A file of format 1 (no `forward=` or `filter=`) loads; those passes take conv-ops' rule.
    #[test]
    fn format_1_files_take_the_lean_rule_for_forward_and_filter() {
        let path = temp("format1");
        let k = kernels().unwrap();
        let old = line(6, 10, 9, 5, "convgemm", "deconvgemm")
            .replace(" forward=convgemm", "")
            .replace(" filter=direct", "");
        fs::write(&path, format!("{HEADER}\nformat=1 kernels={k}\n") + &old).unwrap();
        assert_eq!(load(&path).unwrap(), Loaded::Choices(1));
        let (geom, _, _, preset) = measured_choices()
            .into_iter()
            .find(|(g, ..)| g.in_channels() == 6 && g.out_channels() == 10)
            .unwrap();
        let lean = Preset::lean_for(&geom);
        assert_eq!(
            (preset.forward, preset.backward_data, preset.backward_filter),
            (
                lean.forward,
                BackwardDataAlgo::Deconvgemm,
                lean.backward_filter
            )
        );
        fs::remove_file(&path).unwrap();
    }

    /// Every malformed file is an error naming the file and the line, and loads nothing (a good
    /// line before the bad one included).
    #[test]
    fn bad_files_are_errors_naming_the_line() {
        let path = temp("bad");
        let k = kernels().unwrap();
        let good = line(4, 3, 9, 5, "convgemm", "deconvgemm");
        for (text, lineno, needle) in [
            (String::new(), 1, "not a tuning file"),
            ("hello\n".to_string(), 1, "not a tuning file"),
            (format!("{HEADER}\n"), 2, "missing the `format"),
            (format!("{HEADER}\nformat=9 kernels={k}\n"), 2, "format 9"),
            (format!("{HEADER}\nformat=1\n"), 2, "`kernels=` is missing"),
            (
                header(k) + &good + &good.replace("forward=convgemm", "forward=winograd"),
                4,
                "`forward=winograd` is not one of convgemm, direct",
            ),
            (
                header(k) + &good + &good.replace("filter=direct", "filter=im2col"),
                4,
                "`filter=im2col` is not one of convgemm-trans, direct",
            ),
            (
                header(k) + &good + "threads=1 batch=2\n",
                4,
                "`pad=` is missing",
            ),
            (
                header(k) + &good + &good.replace("algo=convgemm", "algo=fft"),
                4,
                "`algo=fft`",
            ),
            (
                header(k) + &good + &good.replace("algo=convgemm", "algo=im2col"),
                4,
                "never chooses im2col",
            ),
            (
                header(k) + &good + &good.replace("deconvgemm", "col2im"),
                4,
                "`data=col2im`",
            ),
            (
                header(k) + &good + &good.replace("input=9x5", "input=9x-5"),
                4,
                "`input=9x-5`",
            ),
            (
                header(k) + &good + &good.replace("pad=1x1/1x1", "pad=1x1"),
                4,
                "before/after",
            ),
            (
                header(k) + &good + &good.replace("kernel=3x3", "kernel=3x3x3"),
                4,
                "invalid geometry",
            ),
            (
                header(k) + &good + &good.replace("groups=1", "groups=1 colour=red"),
                4,
                "unknown field `colour`",
            ),
            (
                header(k) + &good + &good.replace("threads=", "threads=1 threads="),
                4,
                "given twice",
            ),
            (
                header(k)
                    + &good
                    + &good
                        .replace("stride=1x1", "stride=2x2")
                        .replace("algo=convgemm", "algo=winograd"),
                4,
                "winograd does not apply",
            ),
            (
                header(k)
                    + &good
                    + &good
                        .replace("stride=1x1", "stride=2x2")
                        .replace("data=deconvgemm", "data=flipped-direct"),
                4,
                "FlippedDirect needs stride 1",
            ),
        ] {
            fs::write(&path, &text).unwrap();
            let err = load(&path).unwrap_err().to_string();
            let want = format!("{}, line {lineno}:", path.display());
            assert!(
                err.contains(&want) && err.contains(needle),
                "{text:?}: {err}"
            );
            assert!(
                !measured_choices()
                    .iter()
                    .any(|(g, ..)| g.in_channels() == 4 && g.input() == [9, 5]),
                "{text:?}: the good line was not loaded"
            );
        }
        fs::remove_file(&path).unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
}
