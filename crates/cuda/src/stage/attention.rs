//! Attention sub-layer on the device: Q/KV projections, compressors, indexer selection, attention over
//! the window and the compressed rows (split over candidates for one token), output projections.
use super::*;
use crate::matvec::{launch_mvq8, launch_mvq8_x, x_ok, xpro, XPro};
use crate::dec_attn::DecAttn;
use ds4_model::kv::compressed_capacity;

impl CudaStage {
    pub(super) fn attention(&mut self, li: usize, n: usize, pos0: usize) -> Result<()> {
        let cfg = self.cfg.clone();
        let (d, nh) = (cfg.head_dim, cfg.n_head);
        let qat = self.opts.qat;
        let dec = self.decode_mode;
        let il = self.range.first + li;
        let (hc_fn, hsc, hba) = {
            let l = &self.layers[li];
            (l.hc_attn.fn_, l.hc_attn.scale, l.hc_attn.base)
        };
        let an = self.layers[li].attn_norm;
        let xc = self.hc_pre(hc_fn, hsc, hba, an, n, XnCopies { q80: true, q8k: false, routed: false })?;
        let pre_xn = xc.q80.then(|| self.wk.q8_xn.pair());
        let l = &self.layers[li];
        let (_, q_a, q_a_norm, q_b, kvm, kv_norm, freqs, sinks, ratio) =
            (l.attn_norm, l.q_a, l.q_a_norm, l.q_b, l.kv, l.kv_norm, l.freqs, l.sinks, l.ratio);
        let comp = l.comp.as_ref().map(|c| (c.ape, c.kv, c.gate, c.norm));
        let idx = l.indexer.as_ref().map(|i| (i.q_b, i.proj, i.comp.ape, i.comp.kv, i.comp.gate, i.comp.norm));
        let wk = &self.wk;
        let (_, xn, qr, q, kvb, ck, cg, pooled, o) = (wk.cur.ptr, wk.xn.ptr, wk.qr.ptr, wk.q.ptr, wk.kvb.ptr, wk.ck.ptr, wk.cg.ptr, wk.pooled.ptr, wk.o.ptr);
        // Decode runs three independent chains concurrently (side streams 1 and 2, joined before the
        // indexer): the shared KV row, the compressors, and the Q path; each is latency-bound alone.
        if dec {
            self.g.fork(1)?;
        }
        self.mm_q(&kvm, xn, n, kvb, pre_xn)?;
        self.nrq(kvb, d, kvb, d, n, d, true, kv_norm, freqs, pos0 as i64, 1, 1, if qat { 1 } else { 0 })?;
        if dec {
            self.g.to_main();
            self.g.fork(2)?;
        }
        // Compressors.
        let (ring, comp_rows, st_kv, st_sc, idx_rows, ist_kv, ist_sc) = {
            let k = &self.kv[li];
            let p = |b: &Option<DBuf>| b.as_ref().map_or(0, |b| b.ptr);
            (k.ring.ptr, p(&k.comp), p(&k.st_kv), p(&k.st_sc), p(&k.idx), p(&k.ist_kv), p(&k.ist_sc))
        };
        let nc_last = if ratio != 0 { (pos0 + n) / ratio } else { 0 };
        let mut idx_comp = false;
        if let Some((ape, ckm, cgm, cnorm)) = comp {
            let coff = cfg.compress_coff(il);
            let wd = coff * d;
            let row0 = pos0 / ratio;
            // Decode: one launch that writes the window closing at the device position, if any.
            let (nwin, cr, out0) = if dec { (1, ratio, 0) } else { ((pos0 + n) / ratio - row0, 0, row0) };
            let dp = self.dpos_arg();
            self.mm(&ckm, xn, n, ck)?;
            self.mm(&cgm, xn, n, cg)?;
            let args = [A::P(ck), A::P(cg), A::P(ape), A::P(st_kv), A::P(st_sc), A::P(pooled), A::I(n as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(wd as i32), A::I(d as i32), A::P(dp)];
            self.compress(&args, dec, nwin, wd, d)?;
            self.nrq_at(pooled, d, comp_rows + (out0 * d * 4) as u64, d, nwin, d, true, cnorm, freqs, (row0 * ratio) as i64, 1, ratio, if qat { 1 } else { 0 }, cr)?;
            if let Some((_, _, iape, ikm, igm, inorm)) = idx {
                let id = cfg.idx_dim;
                let iwd = coff * id;
                // Decode: the indexer's compressor on side stream 5 with its own scratch (the two
                // chains, ~14 us each, ran one after the other beside the Q path and outlasted it).
                let (ck, cg, pooled) = if dec { (self.wk.ick.ptr, self.wk.icg.ptr, self.wk.ipool.ptr) } else { (ck, cg, pooled) };
                if dec {
                    self.g.to_main();
                    self.g.fork(5)?;
                }
                self.mm(&ikm, xn, n, ck)?;
                self.mm(&igm, xn, n, cg)?;
                let args = [A::P(ck), A::P(cg), A::P(iape), A::P(ist_kv), A::P(ist_sc), A::P(pooled), A::I(n as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(iwd as i32), A::I(id as i32), A::P(dp)];
                self.compress(&args, dec, nwin, iwd, id)?;
                self.nrq_at(pooled, id, idx_rows + (out0 * id * 4) as u64, id, nwin, id, true, inorm, freqs, (row0 * ratio) as i64, 1, ratio, if qat { 2 } else { 0 }, cr)?;
                idx_comp = dec;
            }
        }
        if dec {
            self.g.to_main();
        }
        // Q path; the indexer's query (from the same normalised qr) and weights run beside q_b in decode.
        let topk = cfg.idx_topk;
        let idx_active = idx.is_some() && (nc_last > topk || dec);
        let ws = 1.0 / ((cfg.idx_dim * cfg.idx_heads) as f32).sqrt();
        let idx_weights = |s: &mut Self, iproj: &DM| -> Result<()> {
            let (ih, iw) = (s.cfg.idx_heads, s.wk.iw.ptr);
            s.mm(iproj, xn, n, iw)?;
            s.g.launch("scale_inplace", (cdiv(n * ih, 256), 1, 1), 256, 0, &[A::P(iw), A::P((n * ih) as u64), A::F(ws)])
        };
        if let (true, true, Some((_, iproj, ..))) = (dec, idx_active, idx) {
            // The indexer's head weights need only xn: side stream 3, beside q_a.
            self.g.fork(3)?;
            idx_weights(self, &iproj)?;
            self.g.to_main();
        }
        self.mm_q(&q_a, xn, n, qr, pre_xn)?;
        // One token: q_b normalises and quantizes qr itself (mvq8_q8p_r*f), and the indexer's copy of
        // the normalised qr is made on its side stream; else the norm writes qr in place (and its Q8_0).
        let q_b_norms = dec && self.takes_q80(&q_b, n) && x_ok(&self.g, &q_b) && xpro(2) && cfg.q_lora % 256 == 0 && q_a_norm % 16 == 0 && qr % 16 == 0;
        let qn = if q_b_norms { self.wk.qrn.ptr } else { qr };
        let pre_qr = (!q_b_norms && self.takes_q80(&q_b, n)).then(|| self.wk.q8_qr.pair());
        if !q_b_norms {
            self.rms_q(qr, cfg.q_lora, qr, cfg.q_lora, cfg.q_lora, q_a_norm, n, pre_qr)?;
        }
        if let (true, Some((iqb, iproj, ..))) = (idx_active, idx) {
            let (ih, id) = (cfg.idx_heads, cfg.idx_dim);
            let iq = self.wk.iq.ptr;
            if dec {
                self.g.fork(1)?;
            }
            if q_b_norms {
                self.rms(qr, cfg.q_lora, qn, cfg.q_lora, cfg.q_lora, q_a_norm, n)?;
            }
            self.mm(&iqb, qn, n, iq)?;
            self.nrq(iq, id, iq, id, n * ih, id, false, 0, freqs, pos0 as i64, ih, 1, if qat { 2 } else { 0 })?;
            if !dec {
                idx_weights(self, &iproj)?;
            }
            if dec {
                self.g.to_main();
            }
        }
        if q_b_norms {
            if !launch_mvq8_x(&mut self.g, &q_b, q_b.ptr, qr, XPro::Rms { w: q_a_norm, eps: cfg.rms_eps }, q)? {
                return Err("q_b product with the q_a norm: not launched".into());
            }
        } else {
            self.mm_q(&q_b, qr, n, q, pre_qr)?;
        }
        // The query's per-head norm and rope; decode folds them into attn_dec (q is read nowhere else).
        if !dec {
            self.nrq(q, d, q, d, n * nh, d, true, 0, freqs, pos0 as i64, nh, 1, 0)?;
        }
        if dec {
            self.g.join(1)?;
            self.g.join(2)?;
            if idx_active {
                self.g.join(3)?;
            }
            if idx_comp {
                self.g.join(5)?;
            }
        }
        // Indexer selection for tokens that see more compressed rows than top_k.
        let mut sel = 0u64;
        if idx.is_some() {
            if idx_active {
                let (ih, id) = (cfg.idx_heads, cfg.idx_dim);
                let (iq, iw, scores, selp, ldsc) = (self.wk.iq.ptr, self.wk.iw.ptr, self.wk.scores.ptr, self.wk.sel.ptr, self.wk.ldsc);
                let smem = ((ih * (id + 1) + 8 * id) * 4) as u32;
                if ih > 256 {
                    return Err("indexer with more than 256 heads".into());
                }
                let dp = self.dpos_arg();
                // Decode: the grid covers the largest row count this context can reach (blocks past the
                // position's rows return at once), so the launch does not depend on the position.
                let rows_grid = if dec { compressed_capacity(self.ctx, ratio) } else { nc_last };
                let args = [A::P(iq), A::P(iw), A::P(idx_rows), A::P(scores), A::I(ldsc as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(topk as i32), A::I(ih as i32), A::I(id as i32), A::P(dp)];
                if !dec && n >= self.gemm_min && ih == 64 && id == 128 {
                    // Prefill on the f16 path: tensor cores.
                    let args = [A::P(iq), A::P(iw), A::P(idx_rows), A::P(scores), A::I(ldsc as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(topk as i32)];
                    self.g.launch("idx_scores_tc", (cdiv(rows_grid, 64), n as u32, 1), 128, 0, &args)?;
                } else {
                    self.g.launch("idx_scores", (cdiv(rows_grid, 8), n as u32, 1), 256, smem, &args)?;
                }
                let args = [A::P(scores), A::I(ldsc as i32), A::P(selp), A::L(pos0 as i64), A::I(ratio as i32), A::I(topk as i32), A::P(dp)];
                self.g.launch("idx_topk", (n as u32, 1, 1), 1024, 0, &args)?;
                sel = selp;
            }
        }
        // Attention.
        let ncomp_max = if sel != 0 { nc_last.min(topk) } else { nc_last };
        let ncand = cfg.swa.min(pos0 + n) + ncomp_max;
        let mut hg = 1usize;
        if n > 1 {
            for c in [16usize, 4] {
                if nh % c == 0 && (c * (d + ncand) * 4) <= 200 * 1024 {
                    hg = c;
                    break;
                }
            }
        }
        if dec {
            return self.attention_decode(li, pos0, sel);
        }
        // Batches on the f16 path (as the GEMMs) with 512-dim heads: tensor-core attention.
        let tc = if n >= self.gemm_min && d == 512 { [64usize, 32].into_iter().find(|&h| h <= self.attn_tc_heads && nh % h == 0) } else { None };
        if let Some(hb) = tc {
            let smem = ((hb + 32) * 520 * 2 + hb * 36 * 4) as u32;
            let args = [
                A::P(q),
                A::P(kvb),
                A::P(ring),
                A::P(comp_rows),
                A::P(sel),
                A::P(sinks),
                A::P(o),
                A::I(nh as i32),
                A::L(pos0 as i64),
                A::I(cfg.swa as i32),
                A::I(ratio as i32),
                A::I(topk as i32),
                A::P(freqs),
                A::I((cfg.rope_dim / 2) as i32),
            ];
            self.g.launch(if hb == 64 { "attn_tc64" } else { "attn_tc32" }, (n as u32, (nh / hb) as u32, 1), 256, smem, &args)?;
            return self.attention_out(li, n, pos0, true, None);
        }
        let smem = ((hg * (d + ncand) + if hg == 1 { 8 * d + 4 } else { 0 }) * 4) as u32;
        if smem > 220 * 1024 {
            return Err(format!("attention over {ncand} candidates needs {smem} bytes of shared memory"));
        }
        let name = match hg {
            16 => "attn_h16",
            4 => "attn_h4",
            _ => "attn_h1",
        };
        let args = [
            A::P(q),
            A::P(kvb),
            A::P(ring),
            A::P(comp_rows),
            A::P(sel),
            A::P(sinks),
            A::P(o),
            A::I(nh as i32),
            A::I(d as i32),
            A::L(pos0 as i64),
            A::I(cfg.swa as i32),
            A::I(ratio as i32),
            A::I(topk as i32),
            A::P(freqs),
            A::I((cfg.rope_dim / 2) as i32),
        ];
        self.g.launch(name, (n as u32, (nh / hg) as u32, 1), 256, smem, &args)?;
        self.attention_out(li, n, pos0, true, None)
    }

    /// Decode attention for one token: the raw query normalised and roped inside attn_dec, candidates
    /// split over blocks, then merged with the ring store and the output's Q8_0 copy (DecAttn).
    pub(super) fn attention_decode(&mut self, li: usize, pos0: usize, sel: u64) -> Result<()> {
        let cfg = &self.cfg;
        let (d, nh, swa, ratio, topk, half) = (cfg.head_dim, cfg.n_head, cfg.swa, self.layers[li].ratio, cfg.idx_topk, cfg.rope_dim / 2);
        // The most candidates this layer can have within the context (the grid does not depend on the
        // position; chunks past the current candidates are skipped).
        let cap = if ratio != 0 { compressed_capacity(self.ctx, ratio) } else { 0 };
        let max_cand = swa.min(self.ctx) + if sel != 0 { cap.min(topk) } else { cap };
        let nsplit = DecAttn::splits(max_cand);
        if nsplit > self.wk.adec_splits {
            return Err(format!("decode attention over {max_cand} candidates exceeds the planned {} splits", self.wk.adec_splits));
        }
        let (l, k) = (&self.layers[li], &self.kv[li]);
        // The merge also writes the Q8_0 copy of the output for the int8 output projection.
        let (q80, d80) = if self.takes_q80(&l.out_a, 1) && d % 32 == 0 { self.wk.q8_o.pair() } else { (0, 0) };
        let a = DecAttn {
            q: self.wk.q.ptr,
            kvb: self.wk.kvb.ptr,
            ring: k.ring.ptr,
            comp: k.comp.as_ref().map_or(0, |b| b.ptr),
            sel,
            sinks: l.sinks,
            freqs: l.freqs,
            part: self.wk.adec.ptr,
            o: self.wk.o.ptr,
            q80,
            d80,
            dpos: self.dpos_arg(),
            pos: pos0 as i64,
            nh,
            d,
            half,
            swa,
            ratio,
            topk,
            nsplit,
            eps: cfg.rms_eps,
        };
        a.launch(&mut self.g)?;
        self.attention_out(li, 1, pos0, false, (q80 != 0).then_some((q80, d80)))
    }

    /// Ring update, grouped low-rank output projection, second projection, HC post.
    /// `pre_o`: the Q8_0 copy of the attention output (one token), taken by the grouped projection.
    pub(super) fn attention_out(&mut self, li: usize, n: usize, pos0: usize, ring_store: bool, pre_o: Option<(u64, u64)>) -> Result<()> {
        let cfg = self.cfg.clone();
        let (d, qd) = (cfg.head_dim, cfg.q_dim());
        let (out_a, out_b) = (self.layers[li].out_a, self.layers[li].out_b);
        let ring = self.kv[li].ring.ptr;
        let (kvb, o, low, y) = (self.wk.kvb.ptr, self.wk.o.ptr, self.wk.low.ptr, self.wk.y.ptr);
        let dp = self.dpos_arg();
        if ring_store {
            self.g.launch("ring_store", (n as u32, 1, 1), 128, 0, &[A::P(kvb), A::P(ring), A::I(n as i32), A::I(d as i32), A::L(pos0 as i64), A::I(cfg.swa as i32), A::P(dp)])?;
        }
        // Grouped low-rank output projection, then the second projection.
        let (g, hpg, ol) = (cfg.o_groups, cfg.heads_per_group(), cfg.o_lora);
        let gin = hpg * d;
        if let Some((q, qdd)) = pre_o {
            launch_mvq8(&mut self.g, &out_a, out_a.ptr, ol * out_a.row_bytes, 0, q, qdd, gin, low, ol, ol, g)?;
        } else if n < self.gemm_min || !self.gemm_ok(&out_a) {
            self.mv(out_a.ptr, &out_a, ol * out_a.row_bytes, 0, o, qd, gin, low, g * ol, ol, ol, n, g)?;
        } else {
            let wh = self.dequant(&out_a, 0)?;
            let oh = self.to_f16(o, qd, n, qd)?;
            for gi in 0..g {
                self.g.gemm_f16(ol, n, gin, wh + (gi * ol * gin * 2) as u64, gin, oh + (gi * gin * 2) as u64, qd, low + (gi * ol * 4) as u64, g * ol)?;
            }
        }
        self.mm(&out_b, low, n, y)?;
        self.exit_attn(n)
    }


    /// Compressor update for a batch (`args` as comp_seq takes them): decode walks its one position
    /// (comp_seq); a prefill chunk pools its `nwin` closing windows in parallel, then updates the state.
    fn compress(&mut self, args: &[A; 12], dec: bool, nwin: usize, w: usize, d: usize) -> Result<()> {
        if dec {
            return self.g.launch("comp_seq", (1, 1, 1), (w as u32).div_ceil(32) * 32, 0, args);
        }
        let [kvp, gp, ape, st_kv, st_sc, pooled, n, pos0, ratio, ..] = *args;
        let pool = [kvp, gp, ape, st_kv, st_sc, pooled, pos0, ratio, A::I(w as i32), A::I(d as i32)];
        self.g.launch("comp_pool", (nwin as u32, cdiv(d, 128), 1), 128, 0, &pool)?;
        let state = [kvp, gp, ape, st_kv, st_sc, n, pos0, ratio, A::I(w as i32)];
        self.g.launch("comp_state", (cdiv(w, 256), 1, 1), 256, 0, &state)
    }
}
