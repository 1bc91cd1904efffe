//! The stage's device KV state to and from the host `KvState` (disk KV cache, session files): the
//! layout conversion is `kv_layout`'s; this file only names the device buffers (the stage keeps the
//! position bookkeeping).
use super::*;
use crate::kv_layout::{self, KvDevice, Part};

impl CudaOps {
    fn part_buf(&self, li: usize, part: Part) -> Option<(u64, usize)> {
        let k = self.kv.get(li)?;
        let b = match part {
            Part::Ring => Some(&k.ring),
            Part::Comp => k.comp.as_ref(),
            Part::CompKv => k.st_kv.as_ref(),
            Part::CompScore => k.st_sc.as_ref(),
            Part::Idx => k.idx.as_ref(),
            Part::IdxKv => k.ist_kv.as_ref(),
            Part::IdxScore => k.ist_sc.as_ref(),
        }?;
        // Exact float counts (allocations round up): the ring and frontiers by their formulas.
        let floats = match part {
            Part::Ring => self.cfg.swa * self.cfg.head_dim,
            Part::CompKv | Part::CompScore => k.st_len,
            Part::IdxKv | Part::IdxScore => k.ist_len,
            Part::Comp => kv_rows(self.ctx, self.layers[li].ratio) * self.cfg.head_dim,
            Part::Idx => kv_rows(self.ctx, self.layers[li].ratio) * self.cfg.idx_dim,
        };
        Some((b.ptr, floats))
    }

    /// Copies the device KV state of the resident layers into `kv`.
    pub(super) fn download_kv(&mut self, kv: &mut KvState) -> Result<()> {
        let r = self.range;
        kv_layout::download(&mut Dev(self), kv, r.first..=r.last)
    }

    /// Makes `kv` the device state of the resident layers (a pending exit is dropped: the streams are
    /// rewritten by the next step).
    pub(super) fn upload_kv(&mut self, kv: &KvState) -> Result<()> {
        let r = self.range;
        self.pend = None;
        kv_layout::upload(&mut Dev(self), kv, r.first..=r.last)
    }
}

fn kv_rows(ctx: usize, ratio: usize) -> usize { ds4_model::kv::compressed_capacity(ctx, ratio) }

/// The stage's buffers as a [`KvDevice`].
struct Dev<'a>(&'a mut CudaOps);

impl KvDevice for Dev<'_> {
    fn floats(&self, li: usize, part: Part) -> Option<usize> { self.0.part_buf(li, part).map(|b| b.1) }

    fn read(&mut self, li: usize, part: Part, dst: &mut [f32]) -> std::result::Result<(), String> {
        let (p, n) = self.0.part_buf(li, part).ok_or("no such device buffer")?;
        if dst.len() > n {
            return Err(format!("reading {} floats from a device buffer of {n}", dst.len()));
        }
        if dst.is_empty() {
            return Ok(());
        }
        self.0.g.dtoh(dst, p)
    }

    fn write(&mut self, li: usize, part: Part, src: &[f32]) -> std::result::Result<(), String> {
        let (p, n) = self.0.part_buf(li, part).ok_or("no such device buffer")?;
        if src.len() > n {
            return Err(format!("writing {} floats to a device buffer of {n}", src.len()));
        }
        if src.is_empty() {
            return Ok(());
        }
        self.0.g.htod(p, src)?;
        // htod from pageable memory may return before the copy is done reading `src`: wait.
        self.0.g.sync()
    }
}
