//! The attention ops on CUDA: Q/KV projections, compressors, indexer selection, attention over the
//! window and the compressed rows (split over candidates for one token), output projections.
use super::*;
use crate::matvec::launch_mvq8;
use crate::dec_attn::DecAttn;
use ds4_gpu::Compressor;
use ds4_model::kv::compressed_capacity;

impl CudaOps {
    /// The sub-layer entry of attention (xn and its Q8_0 copy for the projections after it).
    pub(super) fn attn_entry(&mut self, li: usize, n: usize) -> Result<()> {
        let l = &self.layers[li];
        let (hc_fn, hsc, hba, an) = (l.hc_attn.fn_, l.hc_attn.scale, l.hc_attn.base, l.attn_norm);
        let xc = self.hc_pre(hc_fn, hsc, hba, an, n, XnCopies { q80: true, q8k: false })?;
        self.ls = LayerStep { xc, ..LayerStep::default() };
        Ok(())
    }

    /// The Q8_0 copy of xn the entry wrote, if any.
    pub(super) fn pre_xn(&self) -> Option<(u64, u64)> { self.ls.xc.q80.then(|| self.wk.q8_xn.pair()) }

    pub(super) fn qat_code(&self, indexer: bool) -> i32 {
        match (self.opts.qat, indexer) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        }
    }

    /// The shared KV row: projection, norm, rope, FP8 simulation.
    pub(super) fn kv_row(&mut self, li: usize, s: Step) -> Result<()> {
        let d = self.cfg.head_dim;
        let (kvm, kv_norm, freqs) = (self.layers[li].kv, self.layers[li].kv_norm, self.layers[li].freqs);
        let (xn, kvb) = (self.wk.xn.ptr, self.wk.kvb.ptr);
        let pre = self.pre_xn();
        self.mm_q(&kvm, xn, s.n, kvb, pre)?;
        let qat = self.qat_code(false);
        self.nrq(kvb, d, kvb, d, s.n, d, true, kv_norm, freqs, s.pos0 as i64, 1, 1, qat)
    }

    /// A compressor's update: its two projections, then decode walks its one position (`comp_seq`,
    /// writing the window closing at the device position, if any); a prefill chunk pools its closing
    /// windows in parallel, then updates the state. The pooled rows are normed and roped into place.
    pub(super) fn compress_layer(&mut self, li: usize, which: Compressor, s: Step) -> Result<()> {
        let cfg = self.cfg.clone();
        let (n, pos0, dec) = (s.n, s.pos0, s.decode);
        let il = self.range.first + li;
        let l = &self.layers[li];
        let (ratio, freqs) = (l.ratio, l.freqs);
        let (c, dim) = match which {
            Compressor::Kv => (l.comp.as_ref().ok_or("layer without a compressor")?, cfg.head_dim),
            Compressor::Indexer => (&l.indexer.as_ref().ok_or("layer without an indexer")?.comp, cfg.idx_dim),
        };
        let (ape, ckm, cgm, cnorm) = (c.ape, c.kv, c.gate, c.norm);
        let (rows, st_kv, st_sc) = self.kv[li].compressor(which);
        // Decode: the indexer's compressor has its own scratch (it runs on its own side stream).
        let (ck, cg, pooled) = match (which, dec) {
            (Compressor::Indexer, true) => (self.wk.ick.ptr, self.wk.icg.ptr, self.wk.ipool.ptr),
            _ => (self.wk.ck.ptr, self.wk.cg.ptr, self.wk.pooled.ptr),
        };
        let w = cfg.compress_coff(il) * dim;
        let row0 = pos0 / ratio;
        let (nwin, cr, out0) = if dec { (1, ratio, 0) } else { ((pos0 + n) / ratio - row0, 0, row0) };
        let dp = self.dpos_arg();
        let xn = self.wk.xn.ptr;
        let pre = self.pre_xn();
        self.mm_q(&ckm, xn, n, ck, pre)?;
        self.mm_q(&cgm, xn, n, cg, pre)?;
        let args = [A::P(ck), A::P(cg), A::P(ape), A::P(st_kv), A::P(st_sc), A::P(pooled), A::I(n as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(w as i32), A::I(dim as i32), A::P(dp), A::P(0)];
        self.compress(&args, dec, nwin, w, dim)?;
        let qat = self.qat_code(which == Compressor::Indexer);
        self.nrq_at(pooled, dim, rows + (out0 * dim * 4) as u64, dim, nwin, dim, true, cnorm, freqs, (row0 * ratio) as i64, 1, ratio, qat, cr)
    }

    /// The indexer's per-head weights: projection of xn, scaled by 1/sqrt(dim·heads).
    pub(super) fn indexer_weights(&mut self, li: usize, s: Step) -> Result<()> {
        let (ih, iw, xn) = (self.cfg.idx_heads, self.wk.iw.ptr, self.wk.xn.ptr);
        let ws = 1.0 / ((self.cfg.idx_dim * self.cfg.idx_heads) as f32).sqrt();
        let iproj = self.layers[li].indexer.as_ref().ok_or("layer without an indexer")?.proj;
        let pre = self.pre_xn();
        self.mm_q(&iproj, xn, s.n, iw, pre)?;
        self.g.launch("scale_inplace", (cdiv(s.n * ih, 256), 1, 1), 256, 0, &[A::P(iw), A::P((s.n * ih) as u64), A::F(ws)])
    }

    /// The low-rank query: q_a, then its norm in place with the Q8_0 copy q_b takes.
    pub(super) fn q_lora(&mut self, li: usize, s: Step) -> Result<()> {
        let (q_a, q_a_norm, q_b) = (self.layers[li].q_a, self.layers[li].q_a_norm, self.layers[li].q_b);
        let (xn, qr) = (self.wk.xn.ptr, self.wk.qr.ptr);
        let pre_qr = self.takes_q80(&q_b, s.n).then(|| self.wk.q8_qr.pair());
        self.ls.pre_qr = pre_qr;
        let pre = self.pre_xn();
        self.mm_q(&q_a, xn, s.n, qr, pre)?;
        let ql = self.cfg.q_lora;
        self.rms_q(qr, ql, qr, ql, ql, q_a_norm, s.n, pre_qr)
    }

    /// The indexer's queries from the normalised low-rank query, roped.
    pub(super) fn indexer_query(&mut self, li: usize, s: Step) -> Result<()> {
        let cfg = self.cfg.clone();
        let (ih, id) = (cfg.idx_heads, cfg.idx_dim);
        let l = &self.layers[li];
        let (iqb, freqs) = (l.indexer.as_ref().ok_or("layer without an indexer")?.q_b, l.freqs);
        let (qr, iq) = (self.wk.qr.ptr, self.wk.iq.ptr);
        let pre = self.ls.pre_qr;
        self.mm_q(&iqb, qr, s.n, iq, pre)?;
        let qat = self.qat_code(true);
        self.nrq(iq, id, iq, id, s.n * ih, id, false, 0, freqs, s.pos0 as i64, ih, 1, qat)
    }

    /// The attention queries: q_b, then per-head norm and rope (decode folds those into attn_dec: q
    /// is read nowhere else).
    pub(super) fn q_heads(&mut self, li: usize, s: Step) -> Result<()> {
        let cfg = self.cfg.clone();
        let (d, nh) = (cfg.head_dim, cfg.n_head);
        let l = &self.layers[li];
        let (q_b, freqs) = (l.q_b, l.freqs);
        let (qr, q) = (self.wk.qr.ptr, self.wk.q.ptr);
        let pre = self.ls.pre_qr;
        self.mm_q(&q_b, qr, s.n, q, pre)?;
        if !s.decode {
            self.nrq(q, d, q, d, s.n * nh, d, true, 0, freqs, s.pos0 as i64, nh, 1, 0)?;
        }
        Ok(())
    }

    /// Indexer scores of each token over the compressed rows, then its top-k selection.
    pub(super) fn indexer_select(&mut self, li: usize, s: Step) -> Result<()> {
        let cfg = &self.cfg;
        let (n, pos0, dec) = (s.n, s.pos0, s.decode);
        let (ih, id, topk) = (cfg.idx_heads, cfg.idx_dim, cfg.idx_topk);
        let ratio = self.layers[li].ratio;
        let idx_rows = self.kv[li].idx.as_ref().map_or(0, |b| b.ptr);
        let (iq, iw, scores, selp, ldsc) = (self.wk.iq.ptr, self.wk.iw.ptr, self.wk.scores.ptr, self.wk.sel.ptr, self.wk.ldsc);
        let smem = ((ih * (id + 1) + 8 * id) * 4) as u32;
        if ih > 256 {
            return Err("indexer with more than 256 heads".into());
        }
        let dp = self.dpos_arg();
        // Decode: the grid covers the largest row count this context can reach (blocks past the
        // position's rows return at once), so the launch does not depend on the position.
        let rows_grid = if dec { compressed_capacity(self.ctx, ratio) } else { (pos0 + n) / ratio };
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
        self.ls.sel = selp;
        Ok(())
    }

    /// Attention over the window and the compressed rows (the indexer's selection when `selected`):
    /// decode splits the candidates over blocks (`attention_decode`); a batch takes the tensor-core
    /// kernel on the f16 path (512-dim heads) or the f32 kernels over groups of heads.
    pub(super) fn attend(&mut self, li: usize, s: Step, selected: bool) -> Result<()> {
        let cfg = self.cfg.clone();
        let (d, nh, topk) = (cfg.head_dim, cfg.n_head, cfg.idx_topk);
        let (n, pos0) = (s.n, s.pos0);
        let sel = if selected { self.ls.sel } else { 0 };
        if s.decode {
            return self.attention_decode(li, pos0, sel);
        }
        let l = &self.layers[li];
        let (ratio, sinks, freqs) = (l.ratio, l.sinks, l.freqs);
        let ring = self.kv[li].ring.ptr;
        let comp_rows = self.kv[li].comp.as_ref().map_or(0, |b| b.ptr);
        let (q, kvb, o) = (self.wk.q.ptr, self.wk.kvb.ptr, self.wk.o.ptr);
        let nc_last = if ratio != 0 { (pos0 + n) / ratio } else { 0 };
        let ncomp_max = if sel != 0 { nc_last.min(topk) } else { nc_last };
        let ncand = cfg.swa.min(pos0 + n) + ncomp_max;
        // Batches on the f16 path (as the GEMMs) with 512-dim heads: tensor-core attention.
        let tc = if n >= self.gemm_min && d == 512 { [64usize, 32].into_iter().find(|&h| nh % h == 0) } else { None };
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
            return self.ring_store(li, s);
        }
        let mut hg = 1usize;
        if n > 1 {
            for c in [16usize, 4] {
                if nh % c == 0 && (c * (d + ncand) * 4) <= 200 * 1024 {
                    hg = c;
                    break;
                }
            }
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
        self.ring_store(li, s)
    }

    /// The step's KV rows into the window ring (decode: the merge of attn_dec stores its row).
    fn ring_store(&mut self, li: usize, s: Step) -> Result<()> {
        let d = self.cfg.head_dim;
        let (kvb, ring, dp) = (self.wk.kvb.ptr, self.kv[li].ring.ptr, self.dpos_arg());
        self.g.launch("ring_store", (s.n as u32, 1, 1), 128, 0, &[A::P(kvb), A::P(ring), A::I(s.n as i32), A::I(d as i32), A::L(s.pos0 as i64), A::I(self.cfg.swa as i32), A::P(dp)])
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
            rows: 1,
            pstride: 0,
        };
        a.launch(&mut self.g)?;
        self.ls.pre_o = (q80 != 0).then_some((q80, d80));
        Ok(())
    }

    /// Grouped low-rank output projection (one token: from the Q8_0 copy attn_dec's merge wrote), the
    /// second projection, then the sub-layer exit.
    pub(super) fn attn_out(&mut self, li: usize, s: Step) -> Result<()> {
        let cfg = self.cfg.clone();
        let n = s.n;
        let qd = cfg.q_dim();
        let (out_a, out_b) = (self.layers[li].out_a, self.layers[li].out_b);
        let (o, low, y) = (self.wk.o.ptr, self.wk.low.ptr, self.wk.y.ptr);
        let (g, hpg, ol) = (cfg.o_groups, cfg.heads_per_group(), cfg.o_lora);
        let gin = hpg * cfg.head_dim;
        if self.exact {
            self.out_a_rows(out_a, n)?;
        } else if let Some((q, qdd)) = self.ls.pre_o.take() {
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
    pub(super) fn compress(&mut self, args: &[A; 13], dec: bool, nwin: usize, w: usize, d: usize) -> Result<()> {
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
