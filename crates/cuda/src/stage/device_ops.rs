//! `DeviceOps` for CUDA: the GPU stage's ops mapped onto this backend's kernels and streams (lanes are
//! side streams; decode steps are captured as CUDA graphs and replayed).
use super::*;
use ds4_gpu::{Compressor, DeviceOps, Lane, LayerInfo, Sub};

type R<T> = ds4_gpu::Result<T>;

impl DeviceOps for CudaOps {
    fn bind(&mut self) -> R<()> { Ok(self.g.bind()?) }

    fn layer(&self, li: usize) -> LayerInfo {
        let l = &self.layers[li];
        LayerInfo { ratio: if l.comp.is_some() { l.ratio } else { 0 }, indexer: l.indexer.is_some(), shared_expert: l.shared.is_some() }
    }

    fn has_embed(&self) -> bool { self.embed.is_some() }
    fn has_head(&self) -> bool { self.head.is_some() }
    fn embed_rows(&self) -> usize { self.embed.map_or(0, |e| e.rows) }
    fn hash_routed(&self) -> bool { self.layers.iter().any(|l| l.tid2eid.is_some()) }

    fn begin_step(&mut self, step: Step, tokens: &[u32]) -> R<()> {
        // A step that failed part-way may have left an exit pending on streams that are now rewritten.
        self.pend = None;
        self.exact = false;
        self.same_slot = false;
        self.g.htod(self.wk.tokens.ptr, tokens)?;
        self.decode_mode = step.decode;
        self.g.pdl_now = step.decode;
        if step.decode {
            self.g.htod(self.dpos.ptr, &[step.pos0 as i64])?;
        }
        Ok(())
    }

    fn load_hidden(&mut self, h: &[f32]) -> R<()> { Ok(self.upload_hidden(h)?) }

    fn embed(&mut self, step: Step) -> R<()> {
        let em = self.embed.ok_or("stage without embedding")?;
        let args = [A::P(em.ptr), A::I(ty_code(em.ty)), A::P(self.wk.tokens.ptr), A::P(self.wk.x.ptr), A::I(self.cfg.n_embd as i32), A::I(self.cfg.n_hc as i32)];
        Ok(self.g.launch("embed", (step.n as u32, cdiv(self.cfg.n_embd, 256), 1), 256, 0, &args)?)
    }

    fn fork(&mut self, lane: Lane) -> R<()> { Ok(self.g.fork(lane)?) }
    fn to_main(&mut self) { self.g.to_main() }
    fn join(&mut self, lane: Lane) -> R<()> { Ok(self.g.join(lane)?) }

    fn hc_entry(&mut self, li: usize, sub: Sub, step: Step) -> R<()> {
        Ok(match sub {
            Sub::Attn => self.attn_entry(li, step.n)?,
            Sub::Ffn => self.ffn_entry(li, step.n)?,
        })
    }
    // A batched step's per-sequence ops run row by row against each row's slot (batch.rs).
    fn kv_row(&mut self, li: usize, step: Step) -> R<()> {
        Ok(if step.batch { self.batch_kv_row(li, step)? } else { CudaOps::kv_row(self, li, step)? })
    }
    fn compress(&mut self, li: usize, which: Compressor, step: Step) -> R<()> {
        Ok(if step.batch { self.batch_compress(li, which, step)? } else { self.compress_layer(li, which, step)? })
    }
    fn indexer_weights(&mut self, li: usize, step: Step) -> R<()> { Ok(CudaOps::indexer_weights(self, li, step)?) }
    fn q_lora(&mut self, li: usize, step: Step) -> R<()> { Ok(CudaOps::q_lora(self, li, step)?) }
    fn indexer_query(&mut self, li: usize, step: Step) -> R<()> {
        Ok(if step.batch { self.batch_indexer_query(li, step)? } else { CudaOps::indexer_query(self, li, step)? })
    }
    fn q_heads(&mut self, li: usize, step: Step) -> R<()> {
        Ok(if step.batch { self.batch_q_heads(li, step)? } else { CudaOps::q_heads(self, li, step)? })
    }
    fn indexer_select(&mut self, li: usize, step: Step) -> R<()> {
        Ok(if step.batch { self.batch_indexer_select(li, step)? } else { CudaOps::indexer_select(self, li, step)? })
    }
    fn attend(&mut self, li: usize, step: Step, selected: bool) -> R<()> {
        Ok(if step.batch { self.batch_attend(li, step, selected)? } else { CudaOps::attend(self, li, step, selected)? })
    }
    fn attn_out(&mut self, li: usize, step: Step) -> R<()> { Ok(CudaOps::attn_out(self, li, step)?) }
    fn shared_expert(&mut self, li: usize, step: Step) -> R<()> { Ok(CudaOps::shared_expert(self, li, step)?) }
    fn route(&mut self, li: usize, step: Step) -> R<()> { Ok(CudaOps::route(self, li, step)?) }
    fn experts(&mut self, li: usize, step: Step) -> R<()> { Ok(CudaOps::experts(self, li, step)?) }
    fn ffn_exit(&mut self, _li: usize, step: Step) -> R<()> { Ok(CudaOps::ffn_exit(self, step)?) }
    fn flush(&mut self) -> R<()> { Ok(self.flush_exit()?) }

    fn head_norm(&mut self, r0: usize, m: usize) -> R<()> { Ok(CudaOps::head_norm(self, r0, m)?) }
    fn logits(&mut self, m: usize) -> R<()> { Ok(self.head_logits(m)?) }
    fn argmax(&mut self) -> R<()> { self.argmax_rows(1) }
    fn top1_rows(&self) -> usize { VERIFY_ROWS }
    fn argmax_rows(&mut self, m: usize) -> R<()> {
        if m > VERIFY_ROWS {
            return Err(format!("device picks of {m} rows: at most {VERIFY_ROWS}").into());
        }
        let (lp, tp, v) = (self.wk.logits.ptr, self.wk.top1.ptr, self.cfg.n_vocab);
        for r in 0..m {
            let (row, out) = (lp + (r * v * 4) as u64, tp + (r * TOP1_INTS * 4) as u64);
            self.g.launch("argmax_row", (ARGMAX_BLOCKS, 1, 1), 256, 0, &[A::P(row), A::I(v as i32), A::P(out)])?;
        }
        Ok(())
    }

    fn sync(&mut self) -> R<()> {
        let t = self.host_time.now();
        self.g.sync()?;
        self.host_time.add_wait(t);
        Ok(())
    }
    fn read_logits(&mut self, dst: &mut [f32]) -> R<()> {
        let t = self.host_time.now();
        self.g.dtoh(dst, self.wk.logits.ptr)?;
        self.host_time.add_copy(t);
        Ok(())
    }
    fn read_hidden(&mut self, dst: &mut [f32]) -> R<()> { Ok(self.download_hidden(dst)?) }
    fn read_top1(&mut self) -> R<(u32, f32)> {
        let mut top = [(0, 0.0)];
        self.read_top1_rows(&mut top)?;
        Ok(top[0])
    }
    fn read_top1_rows(&mut self, dst: &mut [(u32, f32)]) -> R<()> {
        let m = dst.len();
        if m > VERIFY_ROWS {
            return Err(format!("device picks of {m} rows: at most {VERIFY_ROWS}").into());
        }
        // The results sit TOP1_INTS apart: bring back the span, keep each pick's first two ints.
        let mut top = [0i32; VERIFY_ROWS * TOP1_INTS];
        let span = &mut top[..(m.max(1) - 1) * TOP1_INTS + 2];
        self.g.dtoh(span, self.wk.top1.ptr)?;
        for (r, d) in dst.iter_mut().enumerate() {
            *d = (span[r * TOP1_INTS] as u32, f32::from_bits(span[r * TOP1_INTS + 1] as u32));
        }
        Ok(())
    }
    fn read_logits_row(&mut self, row: usize, dst: &mut [f32]) -> R<()> {
        let t = self.host_time.now();
        self.g.dtoh(dst, self.wk.logits.ptr + (row * dst.len() * 4) as u64)?;
        self.host_time.add_copy(t);
        Ok(())
    }

    fn reset_state(&mut self) -> R<()> { Ok(CudaOps::reset_state(self)?) }
    fn snapshot(&mut self, restore: bool) -> R<()> { Ok(CudaOps::snapshot(self, restore)?) }
    // Verify steps run as exact rows (exact_rows.rs: the multi-token kernels round otherwise) and are
    // undone in place (undo.rs).
    fn verify_rows(&self) -> usize { if self.verify_capable() { self.undo_cap() } else { 0 } }
    fn undo_rows_cap(&self) -> usize { if self.verify_capable() { self.undo_cap() } else { 0 } }
    fn undo_save(&mut self, pos: usize, n: usize) -> R<()> { Ok(CudaOps::undo_save(self, pos, n)?) }
    fn undo_rows(&mut self, pos: usize, n: usize, keep: usize) -> R<()> { Ok(CudaOps::undo_rows(self, pos, n, keep)?) }
    fn download_kv(&mut self, kv: &mut KvState) -> R<()> { Ok(CudaOps::download_kv(self, kv)?) }
    fn upload_kv(&mut self, kv: &KvState) -> R<()> { Ok(CudaOps::upload_kv(self, kv)?) }

    fn slots(&self) -> usize { CudaOps::slots(self) }
    fn select_slot(&mut self, slot: usize) -> R<()> { Ok(CudaOps::select_slot(self, slot)?) }
    fn begin_batch(&mut self, step: Step, rows: &[(usize, usize)], tokens: &[u32]) -> R<()> { Ok(CudaOps::begin_batch(self, step, rows, tokens)?) }

    // A decode graph holds the KV pointers of the slot it was captured in: each slot records and
    // replays its own (captured the first time that slot decodes a step of that kind).
    fn can_replay(&self) -> bool { self.graphs_usable() }
    fn has_replay(&self, key: usize, _pos: usize) -> bool { self.graphs[self.slot].get(key).is_some_and(|g| g.is_some()) }
    fn begin_record(&mut self, _step: Step) -> R<()> { Ok(self.begin_capture()?) }
    fn end_record(&mut self, key: usize, ok: bool) -> R<()> {
        if key >= self.graphs[self.slot].len() {
            return Err(format!("decode step kind {key} out of range").into());
        }
        Ok(self.end_capture(key, ok)?)
    }
    fn replay(&mut self, key: usize) -> R<()> { Ok(self.launch_graph(key)?) }

    fn can_replay_batch(&self) -> bool { self.batch_replayable() }
    fn has_batch_replay(&self) -> bool { self.has_batch_graph() }
    fn begin_batch_record(&mut self) -> R<()> { Ok(self.begin_capture()?) }
    fn end_batch_record(&mut self, ok: bool) -> R<()> { Ok(self.end_batch_capture(ok)?) }
    fn replay_batch(&mut self) -> R<()> { Ok(self.launch_batch_graph()?) }

    fn note_call(&mut self, one_token: bool) { self.host_time.call(one_token) }
}
