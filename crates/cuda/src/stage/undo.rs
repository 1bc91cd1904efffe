//! In-place undo of a verify step (speculative decoding), slot 0 only.
//!
//! A verify step of `n` rows at `pos..pos + n` overwrites, per layer: the window ring's rows of those
//! positions (each holds position p − swa, still in the window of the kept rows), the ratio-128
//! frontier's rows of those positions (a row past a window end holds the closed window's row), and
//! the ratio-4 frontiers (a window end also moves the current window to the previous one).
//! Everything else a row writes (compressed and indexer rows) is read by count, so rows past the kept
//! position are never read and are written again when those positions are fed.
//!
//! Before the step (`undo_save`) the ring and ratio-128 rows and the whole ratio-4 frontiers are
//! copied aside; during it each row's compressor copies its ratio-4 frontier out after its position
//! (`comp_seq`'s `snap`). A rollback to `keep` rows (`undo_rows`) copies back the rows of the rejected
//! positions and the ratio-4 frontier after row keep − 1: one launch each way, instead of a full
//! checkpoint before every step and the kept rows run again after a rejection.
use super::*;
use ds4_gpu::Compressor;
use ds4_model::kv::compressor_rows;

/// Where one compressor frontier of a layer lives and its place in the layer's undo buffer.
struct Frontier {
    kv: u64,
    sc: u64,
    /// Floats of each of kv and sc.
    len: usize,
    ratio: usize,
    /// Offset (floats) in the undo buffer.
    off: usize,
}

impl Frontier {
    /// Ratio-4 frontiers are kept whole (before the step, then after each row); others row by row.
    fn whole(&self) -> bool { self.ratio == 4 }
    /// Floats of the undo buffer it takes for steps of up to `cap` rows.
    fn floats(len: usize, ratio: usize, cap: usize) -> usize { if ratio == 4 { 2 * len * (1 + cap) } else { 2 * cap * len / compressor_rows(ratio) } }
    fn row(&self) -> usize { self.len / compressor_rows(self.ratio) }
}

/// Undo buffer floats of a layer for steps of up to `cap` rows (ring rows, then each frontier).
pub(super) fn undo_floats(ring_row: usize, frontiers: &[(usize, usize)], cap: usize) -> usize {
    cap * ring_row + frontiers.iter().filter(|f| f.0 > 0).map(|&(len, ratio)| Frontier::floats(len, ratio, cap)).sum::<usize>()
}

impl CudaOps {
    /// Rows of a step slot 0 can undo in place (its undo buffers were sized for them at build).
    pub(super) fn undo_cap(&self) -> usize { self.undo_cap }

    /// Layer `li`'s frontiers (slot 0 selected): the KV compressor's and the indexer's, placed in
    /// the undo buffer after the ring rows.
    fn frontiers(&self, li: usize, cap: usize) -> [Option<Frontier>; 2] {
        let (k, ratio) = (&self.kv[li], self.layers[li].ratio);
        let mut off = cap * self.cfg.head_dim;
        [(&k.st_kv, &k.st_sc, k.st_len), (&k.ist_kv, &k.ist_sc, k.ist_len)].map(|(kv, sc, len)| {
            let (kv, sc) = (kv.as_ref()?, sc.as_ref()?);
            let f = Frontier { kv: kv.ptr, sc: sc.ptr, len, ratio, off };
            off += Frontier::floats(len, ratio, cap);
            Some(f)
        })
    }

    /// Where row `r` of a verify step copies layer `li`'s ratio-4 frontier of `which` after its
    /// position (0: none to copy).
    pub(super) fn frontier_snap(&self, li: usize, which: Compressor, r: usize) -> u64 {
        let cap = self.undo_cap();
        let Some(u) = self.kv[li].undo.as_ref().filter(|_| self.slot == 0 && cap > 0 && r < cap) else { return 0 };
        let [kv, idx] = self.frontiers(li, cap);
        let f = match which {
            Compressor::Kv => kv,
            Compressor::Indexer => idx,
        };
        f.filter(|f| f.whole()).map_or(0, |f| u.ptr + 4 * (f.off + 2 * f.len * (1 + r)) as u64)
    }

    fn check_undo(&self, pos: usize, n: usize) -> Result<usize> {
        let cap = self.undo_cap();
        if self.slot != 0 || cap == 0 {
            return Err("in-place undo is slot 0's, on a stage built with its buffers".into());
        }
        if n > cap {
            return Err(format!("a step of {n} rows: in-place undo holds {cap}"));
        }
        if pos + n > self.ctx {
            return Err(format!("undo of positions {pos}..{} beyond the context {}", pos + n, self.ctx));
        }
        Ok(cap)
    }

    /// Keeps what a step of `n` rows at `pos..` will overwrite and cannot recompute.
    pub(super) fn undo_save(&mut self, pos: usize, n: usize) -> Result<()> {
        let cap = self.check_undo(pos, n)?;
        self.run_jobs(pos, n, cap, None)
    }

    /// Returns slot 0 to the state after the first `keep` rows of the step of `n` rows at `pos..`.
    pub(super) fn undo_rows(&mut self, pos: usize, n: usize, keep: usize) -> Result<()> {
        let cap = self.check_undo(pos, n)?;
        if keep >= n {
            return Ok(());
        }
        self.run_jobs(pos, n, cap, Some(keep))
    }

    /// The copies (src, dst, floats: undo.cu's `CopyJob`) of a save (`keep` None: live → undo
    /// buffer) or of a rollback to `keep` rows (undo buffer → live: rows `keep..n`, and the ratio-4
    /// frontiers), into `jobs`.
    fn undo_jobs(&self, pos: usize, n: usize, cap: usize, keep: Option<usize>, jobs: &mut Vec<u64>) {
        let (d, swa) = (self.cfg.head_dim, self.cfg.swa);
        jobs.clear();
        let mut job = |live: u64, saved: u64, floats: usize| {
            let (src, dst) = if keep.is_some() { (saved, live) } else { (live, saved) };
            jobs.extend_from_slice(&[src, dst, floats as u64]);
        };
        let rows = keep.unwrap_or(0)..n;
        for li in 0..self.kv.len() {
            let (ring, u) = (self.kv[li].ring.ptr, self.kv[li].undo.as_ref().map_or(0, |b| b.ptr));
            let at = |floats: usize| u + 4 * floats as u64;
            for i in rows.clone() {
                job(ring + (4 * ((pos + i) % swa) * d) as u64, at(i * d), d);
            }
            for f in self.frontiers(li, cap).into_iter().flatten() {
                if f.whole() {
                    // Saved whole before the step; after row r at (1 + r): a rollback to `keep` rows
                    // takes the frontier after row keep − 1 (or the saved one for none).
                    let copy = keep.unwrap_or(0);
                    job(f.kv, at(f.off + 2 * f.len * copy), f.len);
                    job(f.sc, at(f.off + 2 * f.len * copy + f.len), f.len);
                    continue;
                }
                let w = f.row();
                for i in rows.clone() {
                    let slot = (pos + i) % f.ratio;
                    job(f.kv + (4 * slot * w) as u64, at(f.off + i * w), w);
                    job(f.sc + (4 * slot * w) as u64, at(f.off + (cap + i) * w), w);
                }
            }
        }
    }

    /// The copies of `undo_jobs`, in one launch of `copy_jobs` (the table uploaded into `wk.jobs`).
    fn run_jobs(&mut self, pos: usize, n: usize, cap: usize, keep: Option<usize>) -> Result<()> {
        let mut jobs = std::mem::take(&mut self.undo_table);
        self.undo_jobs(pos, n, cap, keep, &mut jobs);
        let count = jobs.len() / 3;
        let r = if count > self.wk.jobs_cap {
            Err(format!("{count} undo copies exceed the planned {}", self.wk.jobs_cap))
        } else if count == 0 {
            Ok(())
        } else {
            let table = self.wk.jobs.ptr;
            self.g.htod(table, &jobs).and_then(|()| self.g.launch("copy_jobs", (count as u32, 2, 1), 256, 0, &[A::P(table), A::I(count as i32)]))
        };
        self.undo_table = jobs;
        r
    }
}
