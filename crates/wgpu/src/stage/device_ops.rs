//! `DeviceOps` for wgpu: each op records its dispatches into the step's encoder (opened by
//! `begin_step`, submitted by `sync`). One queue, so lanes are ignored; the shared expert, the expert
//! sum and the FFN exit are one op (`Moe`), recorded at `experts`.
use ds4_gpu::{Compressor as Which, DeviceOps, LayerInfo, Result, Step, Sub};
use ds4_model::KvState;

use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Step as GpuStep;

use super::head::HeadPick;
use super::WgpuOps;

pub(super) fn err(e: WgpuError) -> ds4_gpu::GpuError {
    ds4_gpu::GpuError::Device(e.to_string())
}

impl WgpuOps {
    /// The open step's encoder (opened by the first op after `begin_step` / `begin_record`).
    pub(super) fn enc(&mut self) -> Result<&mut Encoder> {
        let step = self.step.ok_or("wgpu: an op was recorded outside a step")?;
        Ok(self.enc.get_or_insert_with(|| Encoder::new(&self.gpu, step)))
    }

    /// Records `f` on layer `li` into the open step; `op` names it in the profile.
    fn on_layer(&mut self, li: usize, op: &'static str, f: impl FnOnce(&super::layer::Layer, &mut Encoder) -> std::result::Result<(), WgpuError>) -> Result<()> {
        self.enc()?;
        let enc = self.enc.as_mut().expect("opened above");
        let layer = self.layers.get(li).ok_or("wgpu: no such resident layer")?;
        f(layer, enc).map_err(err)?;
        enc.mark(op);
        Ok(())
    }

    /// `on_layer` for an op that ends in a sub-layer exit: `f` also gets the layer's steering op of
    /// `site` when steering is installed.
    fn on_layer_steered(&mut self, li: usize, op: &'static str, site: crate::ops::SteerSite, f: impl FnOnce(&super::layer::Layer, Option<&crate::ops::Steer>, &mut Encoder) -> std::result::Result<(), WgpuError>) -> Result<()> {
        self.enc()?;
        let enc = self.enc.as_mut().expect("opened above");
        let layer = self.layers.get(li).ok_or("wgpu: no such resident layer")?;
        let steer = self.steer.as_ref().and_then(|s| s.op(li, site));
        f(layer, steer, enc).map_err(err)?;
        enc.mark(op);
        Ok(())
    }

    /// Copies the selected KV slot's mutable state (ring, compressor frontiers) of every layer into
    /// the saved copy `which` picks (at the same slot's part, or at its start when `per_slot` is
    /// false: the checkpoint holds one slot), or back (`restore`); recorded into the open step, or
    /// submitted alone.
    fn save_state(&mut self, which: impl Fn(&super::layer::Layer) -> &super::layer::Snapshot, per_slot: bool, restore: bool) -> Result<()> {
        let opened = self.enc.is_none();
        if opened {
            self.enc = Some(Encoder::new(&self.gpu, GpuStep::default()));
        }
        let (slot, slots) = (self.slot, self.slots);
        let enc = self.enc.as_mut().expect("opened above");
        for l in &self.layers {
            let saved = which(l);
            let mut pairs = vec![(&l.ring, &saved.ring)];
            for (c, (k, s)) in l.compressors().zip(&saved.frontiers) {
                pairs.push((&c.st_kv, k));
                pairs.push((&c.st_sc, s));
            }
            for (live, copy) in pairs {
                // Floats of one slot's part, and where the slot's part starts in each buffer.
                let n = live.len() / slots;
                let (at_live, at_copy) = (slot * n, if per_slot { slot * n } else { 0 });
                let ((src, s0), (dst, d0)) = if restore { ((copy, at_copy), (live, at_live)) } else { ((live, at_live), (copy, at_copy)) };
                enc.copy_at(&src.buffer, s0 as u64 * 4, &dst.buffer, d0 as u64 * 4, n as u64 * 4);
            }
        }
        if opened {
            self.sync()?;
        }
        Ok(())
    }

    /// Records the copies of an in-place undo between the live state of the selected slot and the
    /// checkpoint buffers: the ring rows of positions `from..from + n`, and every compressor frontier
    /// whole (the saved state before a step, or back from it).
    fn undo_copies(&self, enc: &mut Encoder, from: usize, n: usize, restore: bool) {
        let (d, swa, slot, slots) = (self.cfg.head_dim, self.cfg.swa, self.slot, self.slots);
        for l in &self.layers {
            let ring_part = l.ring.len() / slots;
            for p in from..from + n {
                let (live, saved) = ((slot * ring_part + (p % swa) * d) as u64 * 4, ((p % swa) * d) as u64 * 4);
                let ((src, s0), (dst, d0)) = if restore { ((&l.ckpt.ring, saved), (&l.ring, live)) } else { ((&l.ring, live), (&l.ckpt.ring, saved)) };
                enc.copy_at(&src.buffer, s0, &dst.buffer, d0, d as u64 * 4);
            }
            for (c, (k, s)) in l.compressors().zip(&l.ckpt.frontiers) {
                for (live, saved) in [(&c.st_kv, k), (&c.st_sc, s)] {
                    let part = live.len() / slots;
                    let (src, s0, dst, d0) = if restore { (saved, 0, live, slot * part) } else { (live, slot * part, saved, 0) };
                    enc.copy_at(&src.buffer, s0 as u64 * 4, &dst.buffer, d0 as u64 * 4, part as u64 * 4);
                }
            }
        }
    }

    fn check_undo(&self, n: usize) -> Result<()> {
        if self.enc.is_some() {
            return Err("wgpu: an undo inside a step".into());
        }
        if n == 0 || n > self.undo_cap {
            return Err(format!("wgpu: an in-place undo of {n} rows (1 to {})", self.undo_cap).into());
        }
        Ok(())
    }

    fn head_ops(&self) -> Result<&super::head::HeadOps> {
        self.head.as_ref().ok_or_else(|| "wgpu: this stage has no output head".into())
    }
}

impl DeviceOps for WgpuOps {
    fn bind(&mut self) -> Result<()> {
        Ok(())
    }

    fn layer(&self, li: usize) -> LayerInfo {
        self.layers[li].info
    }

    fn has_embed(&self) -> bool {
        self.embed.is_some()
    }

    fn has_head(&self) -> bool {
        self.head.is_some()
    }

    fn embed_rows(&self) -> usize {
        self.embed.as_ref().map_or(0, |e| e.rows)
    }

    fn hash_routed(&self) -> bool {
        self.hash_routed
    }

    fn begin_step(&mut self, step: Step, tokens: &[u32]) -> Result<()> {
        if self.enc.is_some() {
            return Err("wgpu: a step began before the previous one was submitted".into());
        }
        let (ntok, pos) = (u32::try_from(step.n).map_err(|_| "wgpu: step too large")?, u32::try_from(step.pos0).map_err(|_| "wgpu: position too large")?);
        self.work.tokens.write_u32(&self.gpu, tokens).map_err(err)?;
        self.write_steer_flags(step.n).map_err(err)?;
        // The uniform is written now, in queue order: a step recorded ahead reads it when submitted.
        self.gpu.write_step(GpuStep { ntok, pos }, self.slot as u32);
        self.step = Some(GpuStep { ntok, pos });
        self.step_n = step.n;
        self.head_rows = 0;
        Ok(())
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn select_slot(&mut self, slot: usize) -> Result<()> {
        if slot >= self.slots {
            return Err(ds4_gpu::GpuError::SlotOutOfRange { slot, slots: self.slots });
        }
        self.slot = slot;
        Ok(())
    }

    fn begin_batch(&mut self, step: Step, rows: &[(usize, usize)], tokens: &[u32]) -> Result<()> {
        if self.enc.is_some() {
            return Err("wgpu: a step began before the previous one was submitted".into());
        }
        if !step.batch || rows.len() != step.n || tokens.len() != step.n {
            return Err(format!("wgpu: a batched step of {} rows with {} slots and {} tokens", step.n, rows.len(), tokens.len()).into());
        }
        // Row (slot, position) pairs for the step uniform, without a heap allocation.
        let mut words = [(0u32, 0u32); crate::gpu::MAX_BATCH_ROWS];
        if rows.len() > words.len() {
            return Err(ds4_gpu::GpuError::BatchOverSlots { n: rows.len(), slots: self.slots });
        }
        for (w, &(slot, pos)) in words.iter_mut().zip(rows) {
            if slot >= self.slots {
                return Err(ds4_gpu::GpuError::SlotOutOfRange { slot, slots: self.slots });
            }
            *w = (slot as u32, u32::try_from(pos).map_err(|_| "wgpu: position too large")?);
            match self.batch_fault {
                super::BatchFault::None => {}
                super::BatchFault::AllSlotZero => w.0 = 0,
                super::BatchFault::PositionPlusOne => w.1 += 1,
            }
        }
        self.work.tokens.write_u32(&self.gpu, tokens).map_err(err)?;
        self.write_steer_flags(step.n).map_err(err)?;
        let enc = self.gpu.begin_batch(&words[..rows.len()]).map_err(err)?;
        self.step = Some(enc.step);
        self.enc = Some(enc);
        self.step_n = step.n;
        self.head_rows = 0;
        Ok(())
    }

    fn load_hidden(&mut self, h: &[f32]) -> Result<()> {
        self.work.x.write(&self.gpu, h).map_err(err)
    }

    fn embed(&mut self, _step: Step) -> Result<()> {
        self.enc()?;
        let e = self.embed.as_ref().ok_or("wgpu: this stage has no embedding")?;
        let enc = self.enc.as_mut().expect("opened above");
        e.op.encode(enc).map_err(err)?;
        enc.mark("embed");
        Ok(())
    }

    fn hc_entry(&mut self, li: usize, sub: Sub, _step: Step) -> Result<()> {
        let op = if sub == Sub::Attn { "hc_entry_attn" } else { "hc_entry_ffn" };
        self.on_layer(li, op, |l, enc| match sub {
            Sub::Attn => l.hc_attn.encode(enc),
            Sub::Ffn => l.hc_ffn.encode(enc),
        })
    }

    fn kv_row(&mut self, li: usize, _step: Step) -> Result<()> {
        self.on_layer(li, "kv_row", |l, enc| l.kv_row(enc))
    }

    fn compress(&mut self, li: usize, which: Which, _step: Step) -> Result<()> {
        let op = if which == Which::Kv { "compress_kv" } else { "compress_idx" };
        // A journaled step (`undo_save`) keeps each compressor's projection rows for the undo.
        let keep = self.undo_step;
        let run = move |c: &super::layer::CompressorOps, enc: &mut Encoder| -> std::result::Result<(), WgpuError> {
            c.encode(enc)?;
            if keep { c.op.keep_rows(enc) } else { Ok(()) }
        };
        self.on_layer(li, op, |l, enc| match which {
            Which::Kv => l.comp.as_ref().map_or(Ok(()), |c| run(c, enc)),
            Which::Indexer => l.idx.as_ref().map_or(Ok(()), |i| run(&i.comp, enc)),
        })
    }

    fn indexer_weights(&mut self, li: usize, _step: Step) -> Result<()> {
        self.on_layer(li, "indexer_weights", |l, enc| l.indexer_weights(enc))
    }

    fn q_lora(&mut self, li: usize, _step: Step) -> Result<()> {
        self.on_layer(li, "q_lora", |l, enc| l.q_lora(enc))
    }

    fn indexer_query(&mut self, li: usize, _step: Step) -> Result<()> {
        self.on_layer(li, "indexer_query", |l, enc| l.indexer_query(enc))
    }

    fn q_heads(&mut self, li: usize, _step: Step) -> Result<()> {
        self.on_layer(li, "q_heads", |l, enc| l.q_heads(enc))
    }

    fn indexer_select(&mut self, li: usize, _step: Step) -> Result<()> {
        self.on_layer(li, "indexer_select", |l, enc| l.indexer_select(enc))
    }

    /// The attention op picks per token: the indexer's rows when the token sees more than top-k.
    fn attend(&mut self, li: usize, _step: Step, _selected: bool) -> Result<()> {
        self.on_layer(li, "attend", |l, enc| l.attend(enc))
    }

    fn attn_out(&mut self, li: usize, _step: Step) -> Result<()> {
        self.on_layer_steered(li, "attn_out", crate::ops::SteerSite::Attn, |l, st, enc| l.attn_out(enc, st))
    }

    /// Recorded with the routed experts (`Moe`).
    fn shared_expert(&mut self, _li: usize, _step: Step) -> Result<()> {
        Ok(())
    }

    fn route(&mut self, li: usize, _step: Step) -> Result<()> {
        self.on_layer(li, "route", |l, enc| l.route(enc))
    }

    fn experts(&mut self, li: usize, _step: Step) -> Result<()> {
        self.on_layer_steered(li, "ffn_exit", crate::ops::SteerSite::Ffn, |l, st, enc| l.moe(enc, st))
    }

    /// Done by `Moe` with the experts.
    fn ffn_exit(&mut self, _li: usize, _step: Step) -> Result<()> {
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    fn head_norm(&mut self, r0: usize, m: usize) -> Result<()> {
        let n = self.step_n;
        let pick = if m == 1 && r0 + 1 == n {
            HeadPick::Last
        } else if r0 == 0 && m == n {
            HeadPick::All
        } else {
            return Err(format!("wgpu: head rows {r0}..{} of a {n}-token step (every row or the last)", r0 + m).into());
        };
        if pick == HeadPick::All && m > self.work.logit_rows {
            return Err(format!("wgpu: logits of {m} rows do not fit one binding ({} rows of {} floats): use a smaller prefill chunk", self.work.logit_rows, self.cfg.n_vocab).into());
        }
        self.head_pick = pick;
        self.enc()?;
        let head = self.head.as_ref().ok_or("wgpu: this stage has no output head")?;
        let enc = self.enc.as_mut().expect("opened above");
        head.norm(enc, pick).map_err(err)?;
        enc.mark("head_norm");
        Ok(())
    }

    fn logits(&mut self, m: usize) -> Result<()> {
        let pick = self.head_pick;
        self.enc()?;
        let head = self.head.as_ref().ok_or("wgpu: this stage has no output head")?;
        let enc = self.enc.as_mut().expect("opened above");
        head.logits(enc, pick).map_err(err)?;
        enc.mark("logits");
        self.head_rows = m;
        Ok(())
    }

    fn argmax(&mut self) -> Result<()> {
        if self.head_rows != 1 {
            return Err("wgpu: the device pick takes one logits row".into());
        }
        self.enc()?;
        let head = self.head.as_ref().ok_or("wgpu: this stage has no output head")?;
        let enc = self.enc.as_mut().expect("opened above");
        head.argmax.encode(enc).map_err(err)?;
        enc.mark("argmax");
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.step = None;
        self.undo_step = false;
        if let Some(enc) = self.enc.take() {
            self.gpu.submit(enc).map_err(err)?;
        }
        self.gpu.wait().map_err(err)
    }

    fn can_replay(&self) -> bool {
        true
    }

    fn has_replay(&self, key: usize, pos: usize) -> bool {
        self.prepared.get(key).is_some_and(|e| e.as_ref().is_some_and(|e| e.step.pos as usize == pos))
    }

    /// Records a decode step ahead: its ops go into an encoder kept for `replay` (the dispatches
    /// depend on the position: windows closing, compressed rows scored).
    fn begin_record(&mut self, step: Step) -> Result<()> {
        if self.enc.is_some() {
            return Err("wgpu: a decode step was recorded inside another step".into());
        }
        let pos = u32::try_from(step.pos0).map_err(|_| "wgpu: position too large")?;
        self.step = Some(GpuStep { ntok: 1, pos });
        Ok(())
    }

    fn end_record(&mut self, key: usize, ok: bool) -> Result<()> {
        let enc = self.enc.take();
        self.step = None;
        let slot = self.prepared.get_mut(key).ok_or_else(|| format!("wgpu: decode step kind {key} out of range"))?;
        *slot = if ok { enc.map(Encoder::sealed) } else { None };
        Ok(())
    }

    /// Submits the step recorded ahead (its tokens and uniform were written by `begin_step`).
    fn replay(&mut self, key: usize) -> Result<()> {
        let enc = self.prepared.get_mut(key).and_then(Option::take).ok_or_else(|| format!("wgpu: no decode step of kind {key} recorded"))?;
        // A step recorded ahead steers as the gate says now (written before it is submitted).
        self.write_steer_flags(1).map_err(err)?;
        self.step = None;
        self.gpu.submit(enc).map_err(err)
    }

    fn replay_consumes(&self) -> bool {
        true
    }

    fn set_steering(&mut self, st: Option<&ds4_model::steering::Steering>, gate: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Result<()> {
        self.install_steering(st, gate).map_err(err)
    }

    fn steer_rows(&mut self, rows: &[bool]) {
        self.set_steer_rows(rows)
    }

    fn read_logits(&mut self, dst: &mut [f32]) -> Result<()> {
        self.sync()?;
        self.read_floats(dst)
    }

    fn read_hidden(&mut self, dst: &mut [f32]) -> Result<()> {
        self.sync()?;
        let v = self.work.x.read(&self.gpu, dst.len()).map_err(err)?;
        dst.copy_from_slice(&v);
        Ok(())
    }

    fn read_top1(&mut self) -> Result<(u32, f32)> {
        self.sync()?;
        let head = self.head_ops()?;
        let p = head.argmax.result(&self.gpu).map_err(err)?;
        Ok((p.index, p.logprob))
    }

    /// Empties the selected slot's compressor frontiers (its ring and rows are read only up to its
    /// position, so they need no clearing).
    fn reset_state(&mut self) -> Result<()> {
        self.sync()?;
        for l in &self.layers {
            for c in l.compressors() {
                c.reset_slot(&self.gpu, self.slot).map_err(err)?;
            }
        }
        Ok(())
    }

    fn snapshot(&mut self, restore: bool) -> Result<()> {
        self.save_state(|l| &l.snap, true, restore)
    }

    fn can_checkpoint(&self) -> bool {
        true
    }

    fn undo_rows_cap(&self) -> usize {
        self.undo_cap
    }

    /// Keeps what a journaled step of `n` rows at `pos` overwrites that cannot be recomputed: the ring
    /// rows of its positions and the compressor frontiers (submitted in queue order before the step).
    fn undo_save(&mut self, pos: usize, n: usize) -> Result<()> {
        self.check_undo(n)?;
        let mut enc = Encoder::new(&self.gpu, GpuStep::default());
        self.undo_copies(&mut enc, pos, n, false);
        self.gpu.submit(enc).map_err(err)?;
        // The step's compressors keep their projection rows (`compress`).
        self.undo_step = true;
        Ok(())
    }

    /// Back to the state after the first `keep` rows of that step: the rejected rows' ring rows and
    /// the frontiers restored, then the frontiers advanced over the kept rows again (their projections
    /// are still in the work buffers). Compressed and indexer rows past the kept position are never
    /// read (they are read by count), so they need nothing.
    fn undo_rows(&mut self, pos: usize, n: usize, keep: usize) -> Result<()> {
        self.check_undo(n)?;
        if keep >= n {
            return Err(format!("wgpu: undo keeping {keep} of {n} rows").into());
        }
        let (p, k) = (u32::try_from(pos).map_err(|_| "wgpu: position too large")?, keep as u32);
        // The kept rows' step (its uniform written in queue order, before this submission).
        let mut enc = if keep > 0 { self.gpu.begin_slot(GpuStep { ntok: k, pos: p }, self.slot as u32) } else { Encoder::new(&self.gpu, GpuStep::default()) };
        self.undo_copies(&mut enc, pos + keep, n - keep, true);
        if keep > 0 {
            for l in &self.layers {
                for c in l.compressors() {
                    c.reapply(&mut enc).map_err(err)?;
                }
            }
        }
        self.undo_step = false;
        self.gpu.submit(enc).map_err(err)?;
        self.gpu.wait().map_err(err)
    }

    fn checkpoint(&mut self, restore: bool) -> Result<()> {
        self.save_state(|l| &l.ckpt, false, restore)
    }

    fn download_kv(&mut self, kv: &mut KvState) -> Result<()> {
        self.sync()?;
        super::kv::download(self, kv)
    }

    fn upload_kv(&mut self, kv: &KvState) -> Result<()> {
        self.sync()?;
        super::kv::upload(self, kv)
    }
}
