//! Several sessions in one step: KV slots and the batched step's per-sequence ops.
//!
//! Each slot owns a full KV set (ring, compressed and indexer rows, compressor frontiers, snapshot).
//! The selected slot's set is `kv`, which the one-sequence ops and the state ops use; `select_slot`
//! swaps sets (no buffer moves). A decode graph captures the pointers of the slot selected while it
//! is recorded, so each slot has its own graphs (`graphs[slot]`), valid whenever that slot is selected.
//!
//! A batched step (`Step::batch`, one token per row, row r in slot `batch[r].0` at position
//! `batch[r].1`; a slot on several rows holds a verify step's consecutive positions, exact_rows.rs) runs the row-independent ops (entries, norms, projections, router, experts, head) on
//! all rows at once with the multi-token kernels; the ops that read or write a sequence's state or
//! depend on its position (rope, compressors, indexer selection, attention, ring store) run row by
//! row: the one-token prefill kernels (not decode mode: the position is an argument) on row r's
//! activations and its slot's buffers.
use super::*;
use crate::dec_attn::DecAttn;
use crate::gpu::SIDE_STREAMS;
use ds4_gpu::Compressor;
use ds4_model::kv::compressed_capacity;

/// Batches of distinct sessions up to this many rows run as exact rows (each row through the decode
/// kernels, bit-identical to decoding it alone) without `--deterministic`: on an H100 (flash:12, ctx
/// 4096, two interleaved rounds, bench/results/batching.md) they decoded 1.16x / 1.06x / 1.04x /
/// 1.19x / 1.10x the multi-token kernels' aggregate rate at 2 / 3 / 4 / 6 / 8 streams. Larger batches
/// (not measured against each other) keep the multi-token kernels, which read each weight once.
pub const EXACT_BATCH_ROWS: usize = 8;

impl CudaOps {
    pub(super) fn slots(&self) -> usize { self.parked.len() }

    /// Makes `slot`'s KV set the one the one-sequence ops use.
    pub(super) fn select_slot(&mut self, slot: usize) -> Result<()> {
        if slot >= self.slots() {
            return Err(format!("KV slot {slot} out of range: this stage holds {}", self.slots()));
        }
        if slot != self.slot {
            // The current set back to its place, then the chosen one out of its place.
            std::mem::swap(&mut self.kv, &mut self.parked[self.slot]);
            std::mem::swap(&mut self.kv, &mut self.parked[slot]);
            self.slot = slot;
        }
        Ok(())
    }

    /// Layer `li`'s KV buffers of `slot`.
    fn slot_kv(&self, slot: usize, li: usize) -> &DKv { if slot == self.slot { &self.kv[li] } else { &self.parked[slot][li] } }

    /// Prepares a batched step: the rows' slots and positions, the token ids (checked by the stage).
    pub(super) fn begin_batch(&mut self, step: Step, rows: &[(usize, usize)], tokens: &[u32]) -> Result<()> {
        if rows.len() != step.n || tokens.len() != step.n || step.n > self.batch_cap {
            return Err(format!("batched step of {} rows and {} tokens for {} rows", rows.len(), tokens.len(), self.batch_cap));
        }
        if let Some(&(s, _)) = rows.iter().find(|r| r.0 >= self.slots()) {
            return Err(format!("KV slot {s} out of range: this stage holds {}", self.slots()));
        }
        // A slot on several rows (a verify step): its rows follow each other at consecutive positions.
        let same_slot = rows.iter().enumerate().any(|(i, r)| rows[..i].iter().any(|o| o.0 == r.0));
        if same_slot {
            // (The step's per-sequence ops then walk one slot: attention and compressors in one launch.)
            if rows.iter().any(|r| r.0 != rows[0].0) {
                return Err("a step with a slot on several rows holds that slot's rows only".into());
            }
            for (i, r) in rows.iter().enumerate() {
                if let Some(prev) = rows[..i].iter().rev().find(|o| o.0 == r.0) {
                    if r.1 != prev.1 + 1 {
                        return Err(format!("rows of KV slot {} at positions {} then {}: a slot's rows must be consecutive", r.0, prev.1, r.1));
                    }
                }
            }
            if !self.verify_capable() {
                return Err("this stage cannot run a slot on several rows of a step".into());
            }
        }
        self.same_slot = same_slot;
        self.exact = same_slot || rows.len() <= self.exact_batch_rows;
        self.pend = None;
        self.decode_mode = false;
        // Programmatic dependent launch, as decode: a batched step runs the one-token kernels, each of
        // which waits for its predecessor before touching activations (only weights are read before).
        self.g.pdl_now = true;
        self.batch.clear();
        self.batch.extend_from_slice(rows);
        let pos: Vec<i64> = rows.iter().map(|r| r.1 as i64).collect();
        self.g.htod(self.wk.bpos.ptr, &pos)?;
        self.g.htod(self.wk.tokens.ptr, tokens)
    }

    /// (slot, position) of batch row `r`.
    fn row(&self, r: usize) -> (usize, usize) { self.batch[r] }

    /// The shared KV rows of a batch: one projection, then each row's norm, rope and QAT at its position.
    pub(super) fn batch_kv_row(&mut self, li: usize, s: Step) -> Result<()> {
        let d = self.cfg.head_dim;
        let (kvm, kv_norm, freqs) = (self.layers[li].kv, self.layers[li].kv_norm, self.layers[li].freqs);
        let (xn, kvb) = (self.wk.xn.ptr, self.wk.kvb.ptr);
        let pre = self.pre_xn();
        self.mm_q(&kvm, xn, s.n, kvb, pre)?;
        let qat = self.qat_code(false);
        self.nrq_rows(kvb, d, s.n, d, true, kv_norm, freqs, 1, qat)
    }

    /// A compressor's update for a batch: both projections of every row at once, then each row's
    /// one-token update of its slot's frontier at its position (and the window it closes, if any,
    /// pooled, normed and roped into its slot's rows).
    pub(super) fn batch_compress(&mut self, li: usize, which: Compressor, s: Step) -> Result<()> {
        let cfg = self.cfg.clone();
        let il = self.range.first + li;
        let l = &self.layers[li];
        let (ratio, freqs) = (l.ratio, l.freqs);
        let (c, dim) = match which {
            Compressor::Kv => (l.comp.as_ref().ok_or("layer without a compressor")?, cfg.head_dim),
            Compressor::Indexer => (&l.indexer.as_ref().ok_or("layer without an indexer")?.comp, cfg.idx_dim),
        };
        let (ape, ckm, cgm, cnorm) = (c.ape, c.kv, c.gate, c.norm);
        // A verify step runs the indexer's compressor beside the main one (own scratch, as decode).
        let (ck, cg) = match which {
            Compressor::Indexer if self.same_slot => (self.wk.ick.ptr, self.wk.icg.ptr),
            _ => (self.wk.ck.ptr, self.wk.cg.ptr),
        };
        let (pooled, xn) = (self.wk.pooled.ptr, self.wk.xn.ptr);
        let w = cfg.compress_coff(il) * dim;
        let pre = self.pre_xn();
        self.mm_q(&ckm, xn, s.n, ck, pre)?;
        self.mm_q(&cgm, xn, s.n, cg, pre)?;
        let qat = self.qat_code(which == Compressor::Indexer);
        let dmax = cfg.head_dim.max(cfg.idx_dim);
        let bpos = self.wk.bpos.ptr;
        if self.same_slot {
            // A verify step's rows (consecutive positions of one slot): one walk over all of them
            // (each closing window pooled into its row's place, each row's frontier copied out),
            // then each row's norm and rope of the window it closes, if any, in one launch.
            let pooled = pooled + (self.g.current() * self.batch_cap * dmax * 4) as u64;
            let (slot, pos) = self.row(0);
            let (rows, st_kv, st_sc) = self.slot_kv(slot, li).compressor(which);
            let snap = self.frontier_snap(li, which, 0);
            let args = [A::P(ck), A::P(cg), A::P(ape), A::P(st_kv), A::P(st_sc), A::P(pooled), A::I(s.n as i32), A::L(pos as i64), A::I(ratio as i32), A::I(w as i32), A::I(dim as i32), A::P(bpos), A::P(snap)];
            self.compress(&args, true, 1, w, dim)?;
            return self.nrq_dp(pooled, dim, rows, dim, s.n, dim, true, cnorm, freqs, 0, 1, ratio, qat, ratio as i32, bpos);
        }
        self.rows_spread(s.n, |me, r, lane| {
            let (slot, pos) = me.row(r);
            // Each stream its own pooled row.
            let pooled = pooled + (lane * dmax * 4) as u64;
            let (rows, st_kv, st_sc) = me.slot_kv(slot, li).compressor(which);
            let off = (r * w * 4) as u64;
            // As a decode step: the one-position walk (comp_seq), then the norm and rope of the window
            // closing there, if any; both read the row's position on the device (the step can be
            // recorded once for every position).
            let dp = bpos + (r * 8) as u64;
            // A verify row copies a ratio-4 frontier out after its position (its in-place undo).
            let snap = if me.same_slot { me.frontier_snap(li, which, r) } else { 0 };
            let args = [A::P(ck + off), A::P(cg + off), A::P(ape), A::P(st_kv), A::P(st_sc), A::P(pooled), A::I(1), A::L(pos as i64), A::I(ratio as i32), A::I(w as i32), A::I(dim as i32), A::P(dp), A::P(snap)];
            me.compress(&args, true, 1, w, dim)?;
            me.nrq_dp(pooled, dim, rows, dim, 1, dim, true, cnorm, freqs, 0, 1, ratio, qat, ratio as i32, dp)
        })
    }

    /// The indexer's queries of a batch: one projection, then each row's heads roped at its position.
    pub(super) fn batch_indexer_query(&mut self, li: usize, s: Step) -> Result<()> {
        let (ih, id) = (self.cfg.idx_heads, self.cfg.idx_dim);
        let l = &self.layers[li];
        let (iqb, freqs) = (l.indexer.as_ref().ok_or("layer without an indexer")?.q_b, l.freqs);
        let (qr, iq) = (self.wk.qr.ptr, self.wk.iq.ptr);
        let pre = self.ls.pre_qr;
        self.mm_q(&iqb, qr, s.n, iq, pre)?;
        let qat = self.qat_code(true);
        self.nrq_rows(iq, id, s.n * ih, id, false, 0, freqs, ih, qat)
    }

    /// The attention queries of a batch: one q_b product, then each row's per-head norm and rope.
    pub(super) fn batch_q_heads(&mut self, li: usize, s: Step) -> Result<()> {
        let (d, nh) = (self.cfg.head_dim, self.cfg.n_head);
        let (q_b, freqs) = (self.layers[li].q_b, self.layers[li].freqs);
        let (qr, q) = (self.wk.qr.ptr, self.wk.q.ptr);
        let pre = self.ls.pre_qr;
        self.mm_q(&q_b, qr, s.n, q, pre)?;
        if self.dec_attn_rows() {
            // The decode attention kernel norms and ropes the raw query itself.
            return Ok(());
        }
        for r in 0..s.n {
            let x = q + (r * nh * d * 4) as u64;
            self.nrq(x, d, x, d, nh, d, true, 0, freqs, self.row(r).1 as i64, nh, 1, 0)?;
        }
        Ok(())
    }

    /// Each row's indexer scores over its slot's compressed rows and its top-k (row r's selection at
    /// `sel + r·topk`; a row that sees at most top_k rows is left to attend to all of them).
    pub(super) fn batch_indexer_select(&mut self, li: usize, s: Step) -> Result<()> {
        let (ih, id, topk) = (self.cfg.idx_heads, self.cfg.idx_dim, self.cfg.idx_topk);
        if ih > 256 {
            return Err("indexer with more than 256 heads".into());
        }
        let ratio = self.layers[li].ratio;
        let (iq, iw, scores, selp, ldsc) = (self.wk.iq.ptr, self.wk.iw.ptr, self.wk.scores.ptr, self.wk.sel.ptr, self.wk.ldsc);
        let smem = ((ih * (id + 1) + 8 * id) * 4) as u32;
        let (bpos, rows_grid) = (self.wk.bpos.ptr, compressed_capacity(self.ctx, ratio).max(1));
        if self.same_slot {
            // A verify step's rows: one launch each for all rows (row i at the first row's position +
            // i: the kernels' multi-token form, each row's sums as its own launch makes them). Every
            // row's compressed rows are in place: the rows' compressor updates ran before.
            let (slot, pos) = self.row(0);
            let idx_rows = self.slot_kv(slot, li).idx.as_ref().map_or(0, |b| b.ptr);
            let args = [A::P(iq), A::P(iw), A::P(idx_rows), A::P(scores), A::I(ldsc as i32), A::L(pos as i64), A::I(ratio as i32), A::I(topk as i32), A::I(ih as i32), A::I(id as i32), A::P(bpos)];
            self.g.launch("idx_scores", (cdiv(rows_grid, 8), s.n as u32, 1), 256, smem, &args)?;
            let args = [A::P(scores), A::I(ldsc as i32), A::P(selp), A::L(pos as i64), A::I(ratio as i32), A::I(topk as i32), A::P(bpos)];
            self.g.launch("idx_topk", (s.n as u32, 1, 1), 1024, 0, &args)?;
            self.ls.sel = selp;
            return Ok(());
        }
        self.rows_spread(s.n, |me, r, _| {
            let (slot, pos) = me.row(r);
            let idx_rows = me.slot_kv(slot, li).idx.as_ref().map_or(0, |b| b.ptr);
            let (iq_r, iw_r) = (iq + (r * ih * id * 4) as u64, iw + (r * ih * 4) as u64);
            let (sc_r, sel_r) = (scores + (r * ldsc * 4) as u64, selp + (r * topk * 4) as u64);
            // As a decode step: the position read on the device, the grid covering the most rows the
            // context allows (blocks past the row's compressed rows return at once).
            let dp = bpos + (r * 8) as u64;
            let args = [A::P(iq_r), A::P(iw_r), A::P(idx_rows), A::P(sc_r), A::I(ldsc as i32), A::L(pos as i64), A::I(ratio as i32), A::I(topk as i32), A::I(ih as i32), A::I(id as i32), A::P(dp)];
            me.g.launch("idx_scores", (cdiv(rows_grid, 8), 1, 1), 256, smem, &args)?;
            let args = [A::P(sc_r), A::I(ldsc as i32), A::P(sel_r), A::L(pos as i64), A::I(ratio as i32), A::I(topk as i32), A::P(dp)];
            me.g.launch("idx_topk", (1, 1, 1), 1024, 0, &args)
        })?;
        self.ls.sel = selp;
        Ok(())
    }

    /// Each row's attention over its slot's window and compressed rows (its selection when
    /// `selected`), at its position; then its KV row into its slot's ring.
    pub(super) fn batch_attend(&mut self, li: usize, s: Step, selected: bool) -> Result<()> {
        if self.dec_attn_rows() {
            return self.batch_attend_dec(li, s, selected);
        }
        let cfg = &self.cfg;
        let (d, nh, topk, swa, half) = (cfg.head_dim, cfg.n_head, cfg.idx_topk, cfg.swa, cfg.rope_dim / 2);
        let sel = if selected { self.ls.sel } else { 0 };
        let l = &self.layers[li];
        let (ratio, sinks, freqs) = (l.ratio, l.sinks, l.freqs);
        let (q, kvb, o) = (self.wk.q.ptr, self.wk.kvb.ptr, self.wk.o.ptr);
        let qd = cfg.q_dim();
        for r in 0..s.n {
            let (slot, pos) = self.row(r);
            let k = self.slot_kv(slot, li);
            let (ring, comp_rows) = (k.ring.ptr, k.comp.as_ref().map_or(0, |b| b.ptr));
            let nc = if ratio != 0 { (pos + 1) / ratio } else { 0 };
            let ncand = swa.min(pos + 1) + if sel != 0 { nc.min(topk) } else { nc };
            // attn_h1's shared memory, as the one-token prefill path sizes it.
            let smem = ((d + ncand + 8 * d + 4) * 4) as u32;
            if smem > 220 * 1024 {
                return Err(format!("attention over {ncand} candidates needs {smem} bytes of shared memory"));
            }
            let sel_r = if sel != 0 { sel + (r * topk * 4) as u64 } else { 0 };
            let kv_r = kvb + (r * d * 4) as u64;
            let args = [
                A::P(q + (r * qd * 4) as u64),
                A::P(kv_r),
                A::P(ring),
                A::P(comp_rows),
                A::P(sel_r),
                A::P(sinks),
                A::P(o + (r * qd * 4) as u64),
                A::I(nh as i32),
                A::I(d as i32),
                A::L(pos as i64),
                A::I(swa as i32),
                A::I(ratio as i32),
                A::I(topk as i32),
                A::P(freqs),
                A::I(half as i32),
            ];
            self.g.launch("attn_h1", (1, nh as u32, 1), 256, smem, &args)?;
            self.g.launch("ring_store", (1, 1, 1), 128, 0, &[A::P(kv_r), A::P(ring), A::I(1), A::I(d as i32), A::L(pos as i64), A::I(swa as i32), A::P(0)])?;
        }
        Ok(())
    }

    /// Whether a batch's rows attend through the decode attention kernels (their head shapes).
    pub(super) fn dec_attn_rows(&self) -> bool {
        let (d, half) = (self.cfg.head_dim, self.cfg.rope_dim / 2);
        d % 4 == 0 && d <= 1024 && 2 * half <= d
    }

    /// Each row's attention as a decode step computes it (`DecAttn`: candidates split over blocks, the
    /// raw query normed and roped inside, the merge storing the row's KV in its slot's ring), at the
    /// row's position over its slot's rows. Rows of distinct sessions spread over the streams (each
    /// stream its partials); a verify step's rows run as one launch.
    fn batch_attend_dec(&mut self, li: usize, s: Step, selected: bool) -> Result<()> {
        let cfg = &self.cfg;
        let (d, nh, topk, swa, half, qd) = (cfg.head_dim, cfg.n_head, cfg.idx_topk, cfg.swa, cfg.rope_dim / 2, cfg.q_dim());
        let eps = cfg.rms_eps;
        let sel = if selected { self.ls.sel } else { 0 };
        let l = &self.layers[li];
        let (ratio, sinks, freqs) = (l.ratio, l.sinks, l.freqs);
        let cap = if ratio != 0 { compressed_capacity(self.ctx, ratio) } else { 0 };
        let nsplit = DecAttn::splits(swa.min(self.ctx) + if sel != 0 { cap.min(topk) } else { cap });
        if nsplit > self.wk.adec_splits {
            return Err(format!("decode attention over {nsplit} chunks exceeds the planned {}", self.wk.adec_splits));
        }
        let (q, kvb, o, part) = (self.wk.q.ptr, self.wk.kvb.ptr, self.wk.o.ptr, self.wk.adec.ptr);
        let part_bytes = (DecAttn::part_floats(self.wk.adec_splits, nh, d) * 4) as u64;
        let bpos = self.wk.bpos.ptr;
        // Exact rows: each merge also writes its row's Q8_0 copy for the output projection, as decode.
        let (q80, d80) = if self.exact && self.takes_q80(&l.out_a, s.n) && d % 32 == 0 { self.wk.q8_o.pair() } else { (0, 0) };
        // A verify step's rows (one sequence): one launch for all of them, row r reading the rows
        // before it from the step's KV rows and keeping its partials in area r.
        let (launches, rows) = if self.same_slot { (1, s.n) } else { (s.n, 1) };
        self.rows_spread(launches, |me, r, lane| {
            if (lane + rows) as u64 * part_bytes > me.wk.adec.bytes as u64 {
                return Err(format!("decode attention partials of {rows} rows on stream {lane} exceed the planned buffer"));
            }
            let (slot, pos) = me.row(r);
            let k = me.slot_kv(slot, li);
            let a = DecAttn {
                q: q + (r * qd * 4) as u64,
                kvb: kvb + (r * d * 4) as u64,
                ring: k.ring.ptr,
                comp: k.comp.as_ref().map_or(0, |b| b.ptr),
                sel: if sel != 0 { sel + (r * topk * 4) as u64 } else { 0 },
                sinks,
                freqs,
                // Each stream its own partials.
                part: part + lane as u64 * part_bytes,
                o: o + (r * qd * 4) as u64,
                q80: if q80 != 0 { q80 + (r * qd) as u64 } else { 0 },
                d80: if d80 != 0 { d80 + (r * qd / 32 * 4) as u64 } else { 0 },
                // The row's position, read on the device (the step can be recorded once).
                dpos: bpos + (r * 8) as u64,
                pos: pos as i64,
                nh,
                d,
                half,
                swa,
                ratio,
                topk,
                nsplit,
                eps,
                rows,
                pstride: (part_bytes / 4) as usize,
            };
            a.launch(&mut me.g)
        })?;
        self.ls.pre_o = (q80 != 0).then_some((q80, d80));
        Ok(())
    }

    /// Runs `f(self, row, lane)` for every row of a batch, the rows spread over the main and side
    /// streams (rows are different sessions: independent; a lane's rows run in order, so per-lane
    /// scratch suffices), then joins the streams. Tiny per-row kernels then overlap on the GPU.
    fn rows_spread(&mut self, n: usize, mut f: impl FnMut(&mut Self, usize, usize) -> Result<()>) -> Result<()> {
        if self.same_slot {
            // Rows of one sequence depend on each other (state, ring): in order, on the stream the
            // op runs on (a verify step's ops take the decode step's lanes); that stream's scratch.
            let lane = self.g.current();
            return (0..n).try_for_each(|r| f(self, r, lane));
        }
        let lanes = n.clamp(1, SIDE_STREAMS + 1);
        for k in 1..lanes {
            self.g.fork(k)?;
        }
        let mut res = Ok(());
        for r in 0..n {
            self.g.on(r % lanes);
            res = f(self, r, r % lanes);
            if res.is_err() {
                break;
            }
        }
        self.g.on(0);
        for k in 1..lanes {
            self.g.join(k)?;
        }
        res
    }

    /// `nrq` over a batch's rows (groups of `div` rows per session), each group at its session's
    /// position (`bpos`, uploaded by `begin_batch`): one launch.
    #[allow(clippy::too_many_arguments)]
    fn nrq_rows(&mut self, x: u64, ld: usize, rows: usize, d: usize, norm: bool, w: u64, freqs: u64, div: usize, qat: i32) -> Result<()> {
        let bpos = self.wk.bpos.ptr;
        self.nrq_dp(x, ld, x, ld, rows, d, norm, w, freqs, 0, div, 0, qat, -1, bpos)
    }
}
