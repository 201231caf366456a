//! The kernel-family registry: which families exist, which the CPU supports, and the one selected
//! once per process (the best available, or the one `CORE_BLAS_ISA` forces).
//!
//! Environment variables read by core-blas (all read once, at the first product):
//! - `CORE_BLAS_ISA` = `scalar` | `avx2` | `avx512` | `neon`: force a family; every entry point
//!   returns [`Error::IsaUnavailable`] if the CPU lacks it (`neon` always does: no NEON family is
//!   built, the portable `scalar` family serves aarch64).
//! - `CORE_BLAS_MC`, `CORE_BLAS_KC`, `CORE_BLAS_NC`: override the derived block sizes, each run
//!   exactly as set ([`crate::Gemm::with_exact_block_sizes`]): passes of KC, A blocks of MC rows,
//!   B blocks of NC columns (MC and NC rounded up to the tile).
//! - `CORE_BLAS_HUGEPAGES=0`: [`crate::AlignedVec`]s of 2 MiB and more (the packing buffers,
//!   conv-ops' and fastconv's workspaces) stay on the heap instead of taking 2 MiB-aligned storage
//!   advised to transparent huge pages (Linux; read at the first such buffer).
//!   `CORE_BLAS_HUGEPAGES_MIN_KB` moves that threshold (default 2048).
//! - `RAYON_NUM_THREADS`: the size of rayon's global pool (rayon's own variable).

use std::sync::OnceLock;

use crate::blocking::Exact;
use crate::kernel::Kernel;
use crate::kernel::portable::Scalar;
#[cfg(target_arch = "x86_64")]
use crate::kernel::x86::{Avx2, Avx512};
use crate::{Error, Gemm};

/// Whether the CPU is Intel's (CPUID vendor string "GenuineIntel"), read once; `false` off
/// x86_64. Kernels key Intel-only choices to it (as BLIS has a sub-configuration per
/// microarchitecture) where the AMD machines of the earlier sessions cannot be re-measured.
pub(crate) fn intel() -> bool {
    static INTEL: OnceLock<bool> = OnceLock::new();
    *INTEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let r = core::arch::x86_64::__cpuid(0);
            // "Genu" "ineI" "ntel" in ebx, edx, ecx.
            (r.ebx, r.edx, r.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// A micro-kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, vectorised by the compiler for the target baseline. Available everywhere.
    Scalar,
    /// x86_64 AVX2 + FMA, 256-bit registers.
    Avx2,
    /// x86_64 AVX-512F, 512-bit registers.
    Avx512,
    /// aarch64 NEON: not built (no aarch64 target to test on); `scalar` serves aarch64.
    Neon,
}

impl Isa {
    /// Every family name `CORE_BLAS_ISA` accepts, in order of preference (worst first).
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Neon, Isa::Avx2, Isa::Avx512];

    /// The name used by `CORE_BLAS_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// Parse a `CORE_BLAS_ISA` value (case-insensitive, surrounding blanks ignored).
    pub fn from_name(name: &str) -> Result<Isa, Error> {
        match name.trim().to_ascii_lowercase().as_str() {
            "scalar" => Ok(Isa::Scalar),
            "avx2" => Ok(Isa::Avx2),
            "avx512" => Ok(Isa::Avx512),
            "neon" => Ok(Isa::Neon),
            _ => Err(Error::UnknownIsa {
                name: name.to_string(),
            }),
        }
    }

    /// The kernel name `{family}-f32-{MR}x{NR}`, or `None` if no kernel of this family is built.
    pub fn kernel_name(self) -> Option<&'static str> {
        match self {
            Isa::Scalar => Some(Scalar::NAME),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(Avx2::NAME),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(Avx512::NAME),
            _ => None,
        }
    }

    /// Can this family run here (built for the target and supported by the CPU)?
    pub fn is_available(self) -> bool {
        Family::new(self).is_some()
    }

    /// The families this host can run, worst first (the last is the default).
    pub fn available() -> Vec<Isa> {
        Isa::ALL
            .into_iter()
            .filter(|isa| isa.is_available())
            .collect()
    }

    fn unavailable(self) -> Error {
        let available = Isa::available()
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
            .join(", ");
        Error::IsaUnavailable {
            requested: self.name(),
            available,
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A kernel value per family: holding one proves the CPU supports it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Family {
    Scalar(Scalar),
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

impl Family {
    pub(crate) fn new(isa: Isa) -> Option<Family> {
        match isa {
            Isa::Scalar => Scalar::new().map(Family::Scalar),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Avx2::new().map(Family::Avx2),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Avx512::new().map(Family::Avx512),
            _ => None,
        }
    }

    pub(crate) fn require(isa: Isa) -> Result<Family, Error> {
        Family::new(isa).ok_or_else(|| isa.unavailable())
    }

    /// `(MR, NR)` of the family's kernel.
    pub(crate) fn tile(self) -> (usize, usize) {
        match self {
            Family::Scalar(_) => (Scalar::MR, Scalar::NR),
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(_) => (Avx2::MR, Avx2::NR),
            #[cfg(target_arch = "x86_64")]
            Family::Avx512(_) => (Avx512::MR, Avx512::NR),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Scalar(_) => Scalar::NAME,
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(_) => Avx2::NAME,
            #[cfg(target_arch = "x86_64")]
            Family::Avx512(_) => Avx512::NAME,
        }
    }
}

fn env_usize(
    var: &'static str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<usize>, Error> {
    match get(var) {
        Some(v) if !v.trim().is_empty() => {
            v.trim().parse::<usize>().map(Some).map_err(|_| Error::Env {
                var,
                value: v.clone(),
                reason: "expected a positive integer",
            })
        }
        _ => Ok(None),
    }
}

/// `gemm` with the block sizes the `CORE_BLAS_MC/KC/NC` variables set (read through `get`),
/// each run exactly ([`crate::blocking::Exact`]); the others keep the derived sizes and the
/// driver's adaptations.
fn with_overrides(gemm: Gemm, get: impl Fn(&str) -> Option<String>) -> Result<Gemm, Error> {
    let mut bs = gemm.block_sizes();
    let mut exact = Exact::default();
    for (var, slot, named) in [
        ("CORE_BLAS_MC", &mut bs.mc, &mut exact.mc),
        ("CORE_BLAS_KC", &mut bs.kc, &mut exact.kc),
        ("CORE_BLAS_NC", &mut bs.nc, &mut exact.nc),
    ] {
        if let Some(v) = env_usize(var, &get)? {
            *slot = v;
            *named = true;
        }
    }
    if exact == Exact::default() {
        return Ok(gemm);
    }
    Ok(gemm.with_block_sizes(bs)?.with_exact(exact))
}

/// The process-wide context: family from `CORE_BLAS_ISA` (or the best available), block sizes
/// derived from the caches with the `CORE_BLAS_MC/KC/NC` overrides. Built once.
pub(crate) fn global() -> Result<&'static Gemm, Error> {
    static GLOBAL: OnceLock<Result<Gemm, Error>> = OnceLock::new();
    GLOBAL
        .get_or_init(|| {
            let isa = match std::env::var("CORE_BLAS_ISA") {
                Ok(name) if !name.trim().is_empty() => Isa::from_name(&name)?,
                _ => *Isa::available().last().unwrap_or(&Isa::Scalar),
            };
            let gemm = Gemm::new(isa)?;
            with_overrides(gemm, |var| std::env::var(var).ok())
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The kernel in use by the free functions (`{family}-f32-{MR}x{NR}`, e.g. `avx512-f32-8x48`), or
/// the error `CORE_BLAS_ISA` causes.
pub fn isa() -> Result<&'static str, Error> {
    global().map(|g| g.kernel_name())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockSizes;

    /// The variables set run exactly, each alone; the others keep the derived sizes and the
    /// driver's adaptations. Values that do not parse or validate are errors.
    #[test]
    fn overrides_are_exact_for_the_sizes_they_name() {
        let g = Gemm::new(Isa::Scalar).unwrap();
        let only = |name: &'static str, value: &'static str| {
            move |var: &str| (var == name).then(|| value.to_string())
        };
        let kc = with_overrides(g, only("CORE_BLAS_KC", " 384 ")).unwrap();
        assert_eq!(
            kc.block_sizes(),
            BlockSizes {
                kc: 384,
                ..g.block_sizes()
            }
        );
        let want = Exact {
            kc: true,
            ..Exact::default()
        };
        assert_eq!(kc.exact(), want);
        let mc = with_overrides(g, only("CORE_BLAS_MC", "96")).unwrap();
        let want = Exact {
            mc: true,
            ..Exact::default()
        };
        assert_eq!((mc.block_sizes().mc, mc.exact()), (96, want));
        let all = with_overrides(g, |_| Some("200".to_string())).unwrap();
        assert_eq!(all.exact(), Exact::ALL);
        let none = with_overrides(g, |_| None).unwrap();
        assert_eq!(
            (none.block_sizes(), none.exact()),
            (g.block_sizes(), Exact::default())
        );
        assert!(with_overrides(g, only("CORE_BLAS_MC", "x")).is_err());
        assert!(with_overrides(g, only("CORE_BLAS_NC", "0")).is_err());
    }
}
