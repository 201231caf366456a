//! [`AlignedVec`]: a growable f32 buffer whose first value sits on a 64-byte boundary (one cache
//! line), the storage of core-blas's packing buffers and, for crates above it that may not write
//! `unsafe`, of operands that the vectorised kernels read row by row.
//!
//! Why it matters: a 256-bit load that straddles two cache lines costs two loads. With rows a
//! multiple of 16 floats apart and the buffer on a line boundary, every vector of every row is on
//! one line (measured on `SmallA::apply_strided`, 02:51 UTC: 15-25% faster than the same rows 16
//! bytes past a line, which is where a large `Vec<f32>` from the system allocator usually starts).
//!
//! **Huge pages (Linux).** A buffer whose storage reaches 2 MiB ([`AlignedVec::huge_pages`]) gets its own anonymous
//! mapping, 2 MiB-aligned, whose whole 2 MiB pages are advised `MADV_HUGEPAGE` before anything
//! touches it, so that with transparent huge pages in `madvise` mode its pages are 2 MiB and one
//! TLB entry covers what 512 did. On a virtual machine a TLB miss walks two page tables (guest and
//! host), which the packing's strided reads and the micro-kernels' C tiles pay. The last, partial
//! 2 MiB of the buffer is not advised: the mapping ends at the next 4 KiB page and that tail keeps
//! 4 KiB pages (a huge page is filled by the kernel as soon as any byte of it is touched, so
//! advising the rounded-up mapping made every such buffer resident up to the next 2 MiB: +50-110
//! MB of peak RSS on ResNet-50 training, session 17). Only a buffer smaller than one huge page
//! (a `CORE_BLAS_HUGEPAGES_MIN_KB` below 2048) is rounded up to a whole advised page. The first
//! touch of each huge page zeroes 2 MiB at once; buffers reused across calls (the packing
//! workspaces, fastconv's and conv-ops' per-thread buffers) pay it once. `CORE_BLAS_HUGEPAGES=0`
//! turns this off (plain 64-byte-aligned heap storage, as before); elsewhere than Linux the
//! storage is always the heap's.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// One 64-byte cache line of f32, so that a `Vec<Line>` is 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// Bytes in one line.
const LINE: usize = size_of::<Line>();

/// Default storage size (bytes) from which an [`AlignedVec`] takes 2 MiB-aligned,
/// huge-page-advised storage on Linux.
const HUGE_MIN_BYTES: usize = 2 << 20;

/// The huge-page size (x86_64 and aarch64 with 4 KiB base pages).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const HUGE_PAGE: usize = 2 << 20;

/// The storage size in bytes from which buffers take huge-page storage, or `None` when they
/// never do: elsewhere than Linux, or `CORE_BLAS_HUGEPAGES=0`. `CORE_BLAS_HUGEPAGES_MIN_KB`
/// overrides the default 2048 (KiB). Both read once per process.
pub(crate) fn huge_min_bytes() -> Option<usize> {
    static MIN: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        let off = std::env::var("CORE_BLAS_HUGEPAGES").is_ok_and(|v| v.trim() == "0");
        if !cfg!(target_os = "linux") || off {
            return None;
        }
        let kb = std::env::var("CORE_BLAS_HUGEPAGES_MIN_KB")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok());
        Some(kb.map_or(HUGE_MIN_BYTES, |kb| kb.saturating_mul(1024).max(LINE)))
    })
}

#[cfg(target_os = "linux")]
mod huge {
    use super::{HUGE_PAGE, LINE, Line};
    use std::ptr::NonNull;

    /// `lines` lines of an anonymous private mapping that starts on a 2 MiB boundary, whose first
    /// `advised` bytes (its whole 2 MiB pages) are advised `MADV_HUGEPAGE`; unmapped on drop.
    /// Owned like a `Box`.
    pub(super) struct Map {
        ptr: NonNull<Line>,
        lines: usize,
        #[cfg_attr(not(test), allow(dead_code))]
        advised: usize,
    }

    /// The base page size (4 KiB on x86_64; read once).
    pub(super) fn page_size() -> usize {
        static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *PAGE.get_or_init(|| {
            // SAFETY: sysconf only reads a system constant.
            let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            usize::try_from(p)
                .ok()
                .filter(|p| p.is_power_of_two() && *p >= LINE && HUGE_PAGE.is_multiple_of(*p))
                .unwrap_or(4096)
        })
    }

    /// `(mapped, advised)` bytes for `need` bytes of storage: the whole 2 MiB pages are advised
    /// and the rest is mapped up to the next base page (not advised), or, below one huge page,
    /// one whole advised huge page.
    pub(super) fn layout(need: usize, page: usize) -> Option<(usize, usize)> {
        let whole = need / HUGE_PAGE * HUGE_PAGE;
        if whole == 0 {
            return Some((HUGE_PAGE, HUGE_PAGE));
        }
        Some((need.checked_next_multiple_of(page)?, whole))
    }

    // SAFETY: `Map` owns its mapping exclusively (as `Box<[Line]>` owns its allocation) and hands
    // it out only through `&self` / `&mut self`, so moving or sharing it across threads is as safe
    // as for a `Vec<Line>`.
    unsafe impl Send for Map {}
    // SAFETY: as above; `&Map` gives read-only access.
    unsafe impl Sync for Map {}

    impl Map {
        /// A zero-filled mapping of at least `lines` lines ([`layout`]), or `None` if the kernel
        /// refuses it.
        pub(super) fn new(lines: usize) -> Option<Self> {
            let (bytes, advised) = layout(lines.checked_mul(LINE)?, page_size())?;
            let span = bytes.checked_add(HUGE_PAGE)?;
            // SAFETY: a new anonymous private mapping (no file, no fixed address): it overlaps no
            // memory the program uses; the kernel fills it with zeros on first touch.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    span,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return None;
            }
            let head = base.addr().next_multiple_of(HUGE_PAGE) - base.addr();
            let start = base.cast::<u8>().wrapping_add(head);
            let tail = span - head - bytes;
            // SAFETY: `[base, base + head)` and `[start + bytes, base + span)` are page-aligned
            // (mmap returns whole pages; head is a difference of page multiples and bytes a
            // multiple of the page size) parts of the mapping just made, which nothing has used;
            // unmapping them leaves `[start, start + bytes)` mapped.
            unsafe {
                if head > 0 {
                    libc::munmap(base, head);
                }
                if tail > 0 {
                    libc::munmap(start.wrapping_add(bytes).cast(), tail);
                }
            }
            // SAFETY: advice on the whole 2 MiB pages of the mapping just made (`advised <=
            // bytes`; its contents are not changed); a kernel without transparent huge pages
            // fails it with EINVAL and the pages stay 4 KiB.
            unsafe { libc::madvise(start.cast(), advised, libc::MADV_HUGEPAGE) };
            Some(Self {
                ptr: NonNull::new(start.cast::<Line>())?,
                lines: bytes / LINE,
                advised,
            })
        }

        /// Bytes advised `MADV_HUGEPAGE` from the start (a multiple of 2 MiB).
        #[cfg(test)]
        pub(super) fn advised(&self) -> usize {
            self.advised
        }

        /// Lines the mapping holds.
        pub(super) fn lines(&self) -> usize {
            self.lines
        }

        pub(super) fn as_ptr(&self) -> *const Line {
            self.ptr.as_ptr()
        }

        pub(super) fn as_mut_ptr(&mut self) -> *mut Line {
            self.ptr.as_ptr()
        }
    }

    impl Drop for Map {
        fn drop(&mut self) {
            // SAFETY: `[ptr, ptr + lines * LINE)` is exactly the mapping `new` kept, owned by
            // `self` and no longer borrowed.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.lines * LINE) };
        }
    }
}

/// Where the lines live.
enum Storage {
    /// `Vec<Line>` from the global allocator; every line initialised.
    Heap(Vec<Line>),
    /// A huge-page mapping (zero-filled by the kernel, so every line is initialised).
    #[cfg(target_os = "linux")]
    Huge(huge::Map),
}

impl Default for Storage {
    fn default() -> Self {
        Storage::Heap(Vec::new())
    }
}

/// A growable f32 buffer aligned to 64 bytes, used like a `Vec<f32>` (`resize`, then as a slice
/// through `Deref`). Shrinking keeps the storage, so a buffer reused across calls allocates only
/// while it grows. From 2 MiB of storage on ([`Self::huge_pages`]), on Linux, the storage is 2 MiB-aligned
/// and advised to the kernel's transparent huge pages (module documentation; `CORE_BLAS_HUGEPAGES=0`
/// turns that off).
///
/// ```
/// let mut v = core_blas::AlignedVec::new();
/// v.resize(100, 1.5);
/// assert_eq!(v.len(), 100);
/// assert_eq!(v.as_ptr() as usize % 64, 0);
/// v[3] = 2.0;
/// assert_eq!(v.iter().sum::<f32>(), 99.0 * 1.5 + 2.0);
/// ```
#[derive(Default)]
pub struct AlignedVec {
    storage: Storage,
    len: usize,
}

impl Clone for AlignedVec {
    fn clone(&self) -> Self {
        Self::from(self.as_slice())
    }
}

impl AlignedVec {
    /// An empty buffer (no allocation).
    pub fn new() -> Self {
        Self::default()
    }

    /// `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        let mut v = Self::new();
        v.resize(len, 0.0);
        v
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Values the buffer holds without reallocating.
    pub fn capacity(&self) -> usize {
        self.lines() * 16
    }

    /// Bytes of the storage advised `MADV_HUGEPAGE` (its whole 2 MiB pages; 0 on the heap).
    #[cfg(test)]
    fn advised_bytes(&self) -> usize {
        match &self.storage {
            Storage::Heap(_) => 0,
            #[cfg(target_os = "linux")]
            Storage::Huge(m) => m.advised(),
        }
    }

    /// Whether the storage is a 2 MiB-aligned mapping advised `MADV_HUGEPAGE` (whether the kernel
    /// then backs it with huge pages is its decision: `/proc/self/smaps`' `AnonHugePages`).
    pub fn is_huge(&self) -> bool {
        match &self.storage {
            Storage::Heap(_) => false,
            #[cfg(target_os = "linux")]
            Storage::Huge(_) => true,
        }
    }

    /// The storage size in bytes from which buffers take 2 MiB-aligned storage advised to
    /// transparent huge pages in this process: 2 MiB (`CORE_BLAS_HUGEPAGES_MIN_KB` overrides), or
    /// `None` when they never do (not Linux, or `CORE_BLAS_HUGEPAGES=0`).
    pub fn huge_pages() -> Option<usize> {
        huge_min_bytes()
    }

    /// As `Vec::resize`: grows to `len` values, the new ones set to `value`, or truncates to `len`
    /// (keeping the storage). The first value stays on a 64-byte boundary.
    pub fn resize(&mut self, len: usize, value: f32) {
        let old = self.len;
        self.grow(len);
        self.len = len;
        if len > old {
            self.as_mut_slice()[old..].fill(value);
        }
    }

    /// The first `len` values after growing the storage to hold them, without setting the new
    /// ones (they hold whatever the storage held: zeros or earlier contents); the length becomes
    /// `len`. For packing buffers that are fully overwritten.
    pub(crate) fn get(&mut self, len: usize) -> &mut [f32] {
        self.grow(len);
        self.len = len;
        self.as_mut_slice()
    }

    /// Lines of storage.
    fn lines(&self) -> usize {
        match &self.storage {
            Storage::Heap(v) => v.len(),
            #[cfg(target_os = "linux")]
            Storage::Huge(m) => m.lines(),
        }
    }

    fn line_ptr(&self) -> *const Line {
        match &self.storage {
            Storage::Heap(v) => v.as_ptr(),
            #[cfg(target_os = "linux")]
            Storage::Huge(m) => m.as_ptr(),
        }
    }

    fn line_mut_ptr(&mut self) -> *mut Line {
        match &mut self.storage {
            Storage::Heap(v) => v.as_mut_ptr(),
            #[cfg(target_os = "linux")]
            Storage::Huge(m) => m.as_mut_ptr(),
        }
    }

    /// Storage for at least `len` values (new lines zeroed; the first `self.len` values kept).
    fn grow(&mut self, len: usize) {
        let need = len.div_ceil(16);
        if self.lines() >= need {
            return;
        }
        #[cfg(target_os = "linux")]
        if huge_min_bytes().is_some_and(|min| need.saturating_mul(LINE) >= min)
            && let Some(mut map) = huge::Map::new(need)
        {
            let keep = self.len.div_ceil(16);
            // SAFETY: both regions hold at least `keep` initialised lines (`keep <= lines()`
            // since `len <= capacity`, and the map holds `need > lines()`); the map is a new
            // mapping, so they do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(self.line_ptr(), map.as_mut_ptr(), keep);
            }
            self.storage = Storage::Huge(map);
            return;
        }
        // The mapping was refused (or is not wanted): continue on the heap.
        #[cfg(target_os = "linux")]
        if let Storage::Huge(_) = self.storage {
            let mut v = Vec::with_capacity(need);
            v.extend_from_slice(&self.lines_slice()[..self.len.div_ceil(16)]);
            v.resize(need, Line([0.0; 16]));
            self.storage = Storage::Heap(v);
            return;
        }
        if let Storage::Heap(v) = &mut self.storage {
            v.resize(need, Line([0.0; 16]));
        }
    }

    /// Every line of the storage.
    #[cfg(target_os = "linux")]
    fn lines_slice(&self) -> &[Line] {
        // SAFETY: the storage holds `lines()` initialised lines (heap lines are initialised by
        // `resize`, mapped ones are the kernel's zeros or values written since); shared borrow.
        unsafe { std::slice::from_raw_parts(self.line_ptr(), self.lines()) }
    }

    /// The values as a slice.
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` around `[f32; 16]` with no padding (size 64 = 16 × 4), so the
        // `lines() * 16 >= len` f32 values are initialised and aligned; shared borrow of self.
        unsafe { std::slice::from_raw_parts(self.line_ptr().cast::<f32>(), self.len) }
    }

    /// The values as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        let len = self.len;
        // SAFETY: as in `as_slice`, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.line_mut_ptr().cast::<f32>(), len) }
    }
}

impl Deref for AlignedVec {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.as_slice()
    }
}

impl DerefMut for AlignedVec {
    fn deref_mut(&mut self) -> &mut [f32] {
        self.as_mut_slice()
    }
}

impl fmt::Debug for AlignedVec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for AlignedVec {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl From<&[f32]> for AlignedVec {
    fn from(values: &[f32]) -> Self {
        let mut v = Self::new();
        v.get(values.len()).copy_from_slice(values);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_keeps_values_alignment_and_storage() {
        let mut v = AlignedVec::new();
        assert!(v.is_empty());
        assert_eq!(v.capacity(), 0);
        v.resize(37, 2.0);
        assert_eq!(v.len(), 37);
        assert!(v.iter().all(|&x| x == 2.0));
        assert_eq!(v.as_ptr() as usize % 64, 0);
        for (i, x) in v.iter_mut().enumerate() {
            *x = i as f32;
        }
        // Growing keeps the old values and sets only the new ones.
        v.resize(1000, -1.0);
        assert_eq!(v.as_ptr() as usize % 64, 0);
        assert!((0..37).all(|i| v[i] == i as f32));
        assert!(v[37..].iter().all(|&x| x == -1.0));
        let cap = v.capacity();
        assert!(cap >= 1000);
        // Truncating keeps the storage; growing again refills with the new value.
        v.resize(10, 0.0);
        assert_eq!(v.len(), 10);
        assert_eq!(v.capacity(), cap);
        v.resize(20, 7.0);
        assert!((0..10).all(|i| v[i] == i as f32));
        assert!(v[10..].iter().all(|&x| x == 7.0));
        assert_eq!(AlignedVec::zeroed(5).as_slice(), &[0.0; 5]);
        let c = AlignedVec::from(&[1.0f32, 2.0, 3.0][..]);
        assert_eq!(c.clone(), c);
        assert_eq!(format!("{c:?}"), "[1.0, 2.0, 3.0]");
    }

    /// Only whole 2 MiB pages are advised; the partial last one is mapped to the next base page
    /// and left to 4 KiB pages; a buffer below one huge page takes a whole advised page.
    #[cfg(target_os = "linux")]
    #[test]
    fn huge_layout_advises_whole_pages_only() {
        const M: usize = HUGE_PAGE;
        for (need, page, want) in [
            (M + 64, 4096, (M + 4096, M)),
            (M, 4096, (M, M)),
            (2 * M - 64, 4096, (2 * M, M)),
            (5 * M + 4097, 4096, (5 * M + 8192, 5 * M)),
            (4 * M, 65536, (4 * M, 4 * M)),
            (4 * M + 1, 65536, (4 * M + 65536, 4 * M)),
            (256 << 10, 4096, (M, M)),
            (64, 4096, (M, M)),
        ] {
            assert_eq!(
                huge::layout(need, page),
                Some(want),
                "need {need} page {page}"
            );
        }
        assert_eq!(huge::layout(usize::MAX - 10, 4096), None);
    }

    /// From the threshold on (if huge pages are on in this process) the storage is a 2 MiB-aligned
    /// mapping whose whole 2 MiB pages are advised; growing into and within it keeps the values,
    /// shrinking keeps the storage, and below the threshold nothing changes.
    #[test]
    fn huge_storage_alignment_growth_and_shrink() {
        let huge = AlignedVec::huge_pages().is_some();
        let off = std::env::var("CORE_BLAS_HUGEPAGES").is_ok_and(|v| v.trim() == "0");
        assert_eq!(huge, cfg!(target_os = "linux") && !off);
        // The threshold in bytes, at least two lines (the test needs a buffer below it).
        let min = AlignedVec::huge_pages()
            .unwrap_or(HUGE_MIN_BYTES)
            .max(2 * LINE);
        let below = min / 4 - 16;
        let mut v = AlignedVec::new();
        v.resize(below, 0.0);
        assert!(!v.is_huge());
        for (i, x) in v.iter_mut().enumerate() {
            *x = i as f32;
        }
        // Crossing the threshold: new storage, old values kept, the new ones set.
        let n1 = min / 4 + 5;
        v.resize(n1, -2.0);
        assert_eq!(v.is_huge(), huge);
        assert_eq!(v.as_ptr() as usize % 64, 0);
        if huge {
            assert_eq!(v.as_ptr() as usize % HUGE_PAGE, 0);
            let (mapped, advised) =
                huge::layout((min + LINE).next_multiple_of(LINE), huge::page_size())
                    .unwrap_or_else(|| unreachable!());
            assert_eq!(v.capacity(), mapped / 4);
            assert_eq!(v.advised_bytes(), advised);
            assert_eq!(advised % HUGE_PAGE, 0);
            assert!(advised <= v.capacity() * 4);
        }
        assert!((0..below).all(|i| v[i] == i as f32));
        assert!(v[below..].iter().all(|&x| x == -2.0));
        // Growing within the rounded storage does not move it.
        let (p, cap) = (v.as_ptr(), v.capacity());
        v.resize(cap, 3.0);
        assert_eq!((v.as_ptr(), v.capacity()), (p, cap));
        assert!(v[n1..].iter().all(|&x| x == 3.0));
        // Growing past it moves to a larger mapping with the values.
        v[cap - 1] = 9.0;
        v.resize(cap + 1, 4.0);
        assert!(v.capacity() > cap);
        assert_eq!(v.is_huge(), huge);
        assert!((0..below).all(|i| v[i] == i as f32));
        assert_eq!((v[cap - 1], v[cap]), (9.0, 4.0));
        // Shrinking keeps the storage; the packing path's `get` sees the earlier contents.
        let (p, cap) = (v.as_ptr(), v.capacity());
        v.resize(7, 0.0);
        assert_eq!((v.as_ptr(), v.capacity(), v.len()), (p, cap, 7));
        assert_eq!(v.get(below)[below - 1], (below - 1) as f32);
        // Clones and conversions of large buffers compare equal and are aligned likewise.
        v.resize(n1, 1.0);
        let c = v.clone();
        assert_eq!(c, v);
        assert_eq!(c.is_huge(), huge);
        let z = AlignedVec::zeroed(3 * min / 4);
        assert_eq!(z.is_huge(), huge);
        assert!(z.iter().all(|&x| x == 0.0));
        // A fresh mapping reads as zeros where `get` exposes storage that was never written.
        let mut g = AlignedVec::new();
        assert!(g.get(min / 4).iter().all(|&x| x == 0.0));
    }
}
