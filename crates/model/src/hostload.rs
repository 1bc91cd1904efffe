//! Bringing a stage's weight spans into host memory: copied into huge-page anonymous memory (the CPU
//! default) or mapped from the file (lazily, or pre-faulted with `warm`), in parallel pieces with a
//! progress callback. The choice is made before any byte is read (the memory plan counts it).
use crate::error::{ModelError, Result};
use crate::mapplan::MapPlan;
use crate::residency;
use rayon::prelude::*;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a stage's weights live on the host (`--weights copy|mmap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightMemory {
    /// Huge-page-advised anonymous memory filled from the file: the CPU default, since decode streams every
    /// weight each token and 4 KiB file pages cost ~30% in TLB misses (bench/results/cpu_decode.md).
    Copy,
    /// Read-only mapping of the file (what a GPU backend uploads from: no second host copy). Pages come in
    /// on first use unless the load pre-faults them (`warm`).
    Mmap,
}

impl WeightMemory {
    /// `copy` (also `anon`, the old name) or `mmap`.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s {
            "copy" | "anon" => Ok(Self::Copy),
            "mmap" => Ok(Self::Mmap),
            o => Err(format!("`{o}`: expected copy or mmap")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Copy => "copy",
            Self::Mmap => "mmap",
        }
    }
}

/// How to bring the spans in. `progress` receives the bytes done so far (from any thread).
pub struct HostLoad<'a> {
    pub memory: WeightMemory,
    /// With `Mmap`: pre-fault every page now (parallel `WILLNEED` + a read per page). `Copy` reads
    /// every page anyway.
    pub warm: bool,
    pub progress: &'a (dyn Fn(u64) + Sync),
}

impl HostLoad<'_> {
    /// Copy into memory, reporting nothing (tests, tools).
    pub fn copy() -> HostLoad<'static> { HostLoad { memory: WeightMemory::Copy, warm: false, progress: &|_| {} } }
}

/// One mapping of the map plan: its own mmap of a file span, or (for in-memory files) a window of the
/// file's bytes.
pub enum Region {
    Mapped(memmap2::Mmap),
    Anon(memmap2::MmapMut),
    Window(std::ops::Range<usize>),
}

/// Pieces the parallel copy and warm-up work in: big enough to stream, small enough to spread over
/// threads and to move a progress bar.
const PIECE: usize = 32 << 20;

/// Brings every span of `plan` in from `path` as `load` says.
pub fn load_spans(path: &Path, plan: &MapPlan, load: &HostLoad) -> Result<Vec<Region>> {
    let f = std::fs::File::open(path).map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))?;
    let done = AtomicU64::new(0);
    let step = |n: usize| {
        residency::add_loaded(n as u64);
        (load.progress)(done.fetch_add(n as u64, Ordering::Relaxed) + n as u64);
    };
    plan.spans
        .iter()
        .map(|r| {
            let len = (r.end - r.start) as usize;
            match load.memory {
                WeightMemory::Copy => copy_span(&f, path, r.start, len, &step).map(Region::Anon),
                WeightMemory::Mmap => map_span(&f, path, r.start, len, load.warm, &step).map(Region::Mapped),
            }
        })
        .collect()
}

/// Reads `len` bytes at `start` into fresh anonymous (huge-page advised) memory, pieces in parallel.
fn copy_span(f: &std::fs::File, path: &Path, start: u64, len: usize, step: &(dyn Fn(usize) + Sync)) -> Result<memmap2::MmapMut> {
    use std::os::unix::fs::FileExt;
    let err = |e: std::io::Error| ModelError::Invalid(format!("loading {}: {e}", path.display()));
    let mut m = memmap2::MmapMut::map_anon(len).map_err(err)?;
    #[cfg(target_os = "linux")]
    let _ = m.advise(memmap2::Advice::HugePage);
    m.par_chunks_mut(PIECE).enumerate().try_for_each(|(i, piece)| {
        f.read_exact_at(piece, start + (i * PIECE) as u64).map_err(err)?;
        step(piece.len());
        Ok::<(), ModelError>(())
    })?;
    Ok(m)
}

/// Maps `len` bytes at `start` read-only; with `warm`, faults every page in now, pieces in parallel.
fn map_span(f: &std::fs::File, path: &Path, start: u64, len: usize, warm: bool, step: &(dyn Fn(usize) + Sync)) -> Result<memmap2::Mmap> {
    // SAFETY: read-only mapping of a model file the engine does not modify; like any mmap it assumes
    // no other process truncates the file while it is mapped.
    let m = unsafe { memmap2::MmapOptions::new().offset(start).len(len).map(f) }
        .map_err(|e| ModelError::Invalid(format!("mapping {start}..{} of {}: {e}", start + len as u64, path.display())))?;
    if warm {
        // Start the kernel's read-ahead for the whole span, then touch a byte of every page.
        let _ = m.advise(memmap2::Advice::WillNeed);
        m.par_chunks(PIECE).for_each(|piece| {
            let sum = piece.iter().step_by(4096).fold(0u8, |a, &b| a ^ b);
            std::hint::black_box(sum);
            step(piece.len());
        });
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn file_of(bytes: &[u8]) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("ds4-hostload-{}-{}", std::process::id(), bytes.len()));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn copy_and_map_hold_the_file_bytes_and_report_progress() {
        // Spans larger than a piece exercise the parallel split; contents are a byte pattern.
        let bytes: Vec<u8> = (0..(PIECE * 2 + 12345)).map(|i| (i * 7 + i / 4099) as u8).collect();
        let path = file_of(&bytes);
        let plan = MapPlan::build(vec![100..(PIECE as u64 + 5000), (PIECE as u64 + 9000)..bytes.len() as u64], 32);
        for (memory, warm) in [(WeightMemory::Copy, false), (WeightMemory::Mmap, true), (WeightMemory::Mmap, false)] {
            let seen = Mutex::new(Vec::new());
            let progress = |d: u64| seen.lock().unwrap().push(d);
            let regions = load_spans(&path, &plan, &HostLoad { memory, warm, progress: &progress }).unwrap();
            for (r, span) in regions.iter().zip(&plan.spans) {
                let got: &[u8] = match r {
                    Region::Anon(m) => m,
                    Region::Mapped(m) => m,
                    Region::Window(_) => unreachable!(),
                };
                assert!(got == &bytes[span.start as usize..span.end as usize], "{memory:?}");
            }
            let seen = seen.into_inner().unwrap();
            if memory == WeightMemory::Mmap && !warm {
                assert!(seen.is_empty(), "a lazy mapping reads nothing at load");
            } else {
                assert_eq!(seen.iter().max().copied(), Some(plan.bytes()), "{memory:?}");
            }
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn weight_memory_parses_the_flag_values() {
        assert_eq!(WeightMemory::parse("copy"), Ok(WeightMemory::Copy));
        assert_eq!(WeightMemory::parse("anon"), Ok(WeightMemory::Copy));
        assert_eq!(WeightMemory::parse("mmap"), Ok(WeightMemory::Mmap));
        assert!(WeightMemory::parse("mlock").unwrap_err().contains("copy or mmap"));
    }
}
