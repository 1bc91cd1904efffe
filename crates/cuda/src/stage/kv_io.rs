//! The stage's device KV state to and from the host `KvState` (disk KV cache, session files): the
//! layout conversion is `kv_layout`'s; this file only names the device buffers and keeps the stage's
//! position bookkeeping (device position, snapshot) consistent with what was copied.
use super::*;
use crate::kv_layout::{self, KvDevice, Part};

impl CudaStage {
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

    /// Copies the device KV state of this stage's layers into `kv` (which must be at the position the
    /// device holds, or at its snapshot's): what a session file or the disk KV cache saves.
    pub fn download_kv(&mut self, kv: &mut KvState) -> ds4_model::Result<()> {
        self.g.bind().map_err(me)?;
        self.sync_state(kv.pos).map_err(me)?;
        self.g.sync().map_err(me)?;
        let r = self.range;
        kv_layout::download(&mut Dev(self), kv, r.first..=r.last).map_err(me)
    }

    /// Makes `kv` (restored from a file, or from another backend) the device state; the next forward
    /// call continues from `kv.pos`. Nothing is written when `kv` does not match the stage's layers.
    pub fn upload_kv(&mut self, kv: &KvState) -> ds4_model::Result<()> {
        self.g.bind().map_err(me)?;
        if kv.pos > self.ctx {
            return Err(me(format!("the KV state is at position {}, beyond the context {} the stage was sized for", kv.pos, self.ctx)));
        }
        let r = self.range;
        // A failed copy part-way leaves a mixed state: the device is then fresh state only.
        let res = kv_layout::upload(&mut Dev(self), kv, r.first..=r.last);
        self.pend = None;
        match res {
            Ok(()) => {
                self.dev_pos = kv.pos;
                // As after a prefill: a later rewind to this position finds it.
                self.snapshot(false).map_err(me)?;
                self.snap_pos = Some(kv.pos);
                self.g.sync().map_err(me)
            }
            Err(e) => {
                self.snap_pos = None;
                self.dev_pos = usize::MAX;
                Err(me(e))
            }
        }
    }
}

fn kv_rows(ctx: usize, ratio: usize) -> usize { ds4_model::kv::compressed_capacity(ctx, ratio) }

/// The stage's buffers as a [`KvDevice`].
struct Dev<'a>(&'a mut CudaStage);

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
