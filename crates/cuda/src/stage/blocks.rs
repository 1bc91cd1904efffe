//! Building blocks of the forward pass on the device: products, norms, rope/QAT, hyper-connection
//! entry and exit, the output head.
use super::*;
use crate::matvec::{launch_moe_gemm, launch_dq, launch_mv_split, launch_mvq8_ks, launch_q80, mvq_ks, q80_ok};

impl CudaOps {
    /// Mat-vec kernel over `n` tokens for `z` slots (see MV_ARGS in matvec.cuh).
    /// One token under `Precision::Fast` takes Q8_0 activations for split Q8_0 matrices (as the
    /// CPU); the quantized copy goes to the current stream's own scratch (side streams run at once).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mv(&mut self, w: u64, m: &DM, w_mat_bytes: usize, eids: u64, x: u64, ldx: usize, x_z: usize, y: u64, ldy: usize, y_z: usize, rows: usize, n: usize, z: usize) -> Result<()> {
        self.mv_split(w, m, w_mat_bytes, eids, x, ldx, x_z, y, ldy, y_z, rows, n, z, z)
    }

    /// [`CudaOps::mv`] with the K split of a launch of `ks_z` slots (each slot then sums as it does
    /// there: the rows of a batch or verify step as their decode steps).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mv_split(&mut self, w: u64, m: &DM, w_mat_bytes: usize, eids: u64, x: u64, ldx: usize, x_z: usize, y: u64, ldy: usize, y_z: usize, rows: usize, n: usize, z: usize, ks_z: usize) -> Result<()> {
        let rows_in = if x_z == 0 { 1 } else { z };
        if self.fast_q8 && n == 1 && q80_ok(m) && m.cols * rows_in <= self.wk.xq80_cap {
            let s = self.g.current();
            let q = self.wk.xq80.ptr + (s * self.wk.xq80_cap) as u64;
            let d = self.wk.xq80d.ptr + (s * self.wk.xq80_cap / 32 * 4) as u64;
            launch_q80(&mut self.g, x, x_z, m.cols, rows_in, q, d)?;
            return launch_mvq8_ks(&mut self.g, m, w, w_mat_bytes, eids, q, d, if x_z == 0 { 0 } else { m.cols }, y, y_z, rows, z, mvq_ks(m, rows, ks_z));
        }
        launch_mv_split(&mut self.g, m, w, w_mat_bytes, eids, x, ldx, x_z, y, ldy, y_z, rows, n, z, ks_z)
    }

    /// f16 copy of matrix `idx` of a stack (the weights themselves when already F16).
    pub(super) fn dequant(&mut self, m: &DM, idx: usize) -> Result<u64> {
        let src = m.ptr + (idx * m.mat_bytes()) as u64;
        if m.ty == GgmlType::F16 {
            return Ok(src);
        }
        let elems = m.rows * m.cols;
        if elems > self.wk.wh_elems {
            return Err("dequantization scratch too small".into());
        }
        let dst = self.wk.wh.ptr;
        launch_dq(&mut self.g, m, src, dst, elems)?;
        Ok(dst)
    }

    pub(super) fn to_f16(&mut self, x: u64, ld: usize, rows: usize, cols: usize) -> Result<u64> {
        let dst = self.wk.xh.ptr;
        let args = [A::P(x), A::I(ld as i32), A::P(dst), A::I(rows as i32), A::I(cols as i32)];
        if x % 16 == 0 && ld % 4 == 0 && cols % 4 == 0 {
            self.g.launch("f32_to_f16_v4", (cdiv(rows * cols / 4, 256), 1, 1), 256, 0, &args)?;
        } else {
            self.g.launch("f32_to_f16", (cdiv(rows * cols, 256), 1, 1), 256, 0, &args)?;
        }
        Ok(dst)
    }

    pub(super) fn gemm_ok(&self, m: &DM) -> bool { m.ty == GgmlType::F16 || m.rows * m.cols <= self.wk.wh_elems }

    /// y (n × rows, ldy) = x (n × cols, ldx) · Wᵀ for matrix `idx` of `m`.
    pub(super) fn mm_idx(&mut self, m: &DM, idx: usize, x: u64, ldx: usize, n: usize, y: u64, ldy: usize) -> Result<()> {
        // Few output rows (the hyper-connection mix: 24 rows of 16384; the indexer weights: 64): in
        // prefill cuBLAS took milliseconds for these (7 ms at 24 x 4096 tokens x 16384); the mat-vec
        // kernel reads the small matrix from L2 per 4 tokens.
        if self.exact {
            // Each row as its one-token product (its own input row, the one-token K split).
            let w = m.ptr + (idx * m.mat_bytes()) as u64;
            return self.mv_split(w, m, 0, 0, x, ldx, ldx, y, ldy, ldy, m.rows, 1, n, 1);
        }
        if n < self.gemm_min || !self.gemm_ok(m) || m.rows < 128 {
            let w = m.ptr + (idx * m.mat_bytes()) as u64;
            return self.mv(w, m, 0, 0, x, ldx, 0, y, ldy, 0, m.rows, n, 1);
        }
        let wh = self.dequant(m, idx)?;
        let xh = self.to_f16(x, ldx, n, m.cols)?;
        // Up to 512 rows: cuBLAS measured 27 us for 512 x 4096 tokens x 4096 alone but ~5 ms inside
        // the prefill (256 rows: 450 us); the tensor-core tile kernel of the grouped expert GEMM
        // runs the product as one dense group.
        if m.rows <= 512 && m.rows % 128 == 0 && m.cols % 64 == 0 && ldy == m.rows {
            let args = [A::P(wh), A::P(0), A::P(0), A::P(xh), A::P(y), A::I(m.cols as i32), A::I(m.rows as i32), A::I(n as i32)];
            let bt = if n >= 256 { 128 } else { 64 };
            return launch_moe_gemm(&mut self.g, "moe_gemm", bt, (cdiv(n, bt), (m.rows / 128) as u32, 1), &args);
        }
        self.g.gemm_f16(m.rows, n, m.cols, wh, m.cols, xh, m.cols, y, ldy)
    }

    pub(super) fn mm(&mut self, m: &DM, x: u64, n: usize, y: u64) -> Result<()> { self.mm_idx(m, 0, x, m.cols, n, y, m.rows) }

    /// Whether a one-token product with `m` takes a Q8_0 copy of its input written by the producer
    /// (decode; exact rows, each row its own copy).
    pub(super) fn takes_q80(&self, m: &DM, n: usize) -> bool {
        (self.decode_mode && n == 1 || self.exact && n <= self.batch_cap) && self.fast_q8 && q80_ok(m)
    }

    /// `mm` whose input also exists as the Q8_0 copy `pre` (values, scales; `n` rows of `m.cols`),
    /// when the product takes it: the rows as slots of one launch with the one-token K split.
    pub(super) fn mm_q(&mut self, m: &DM, x: u64, n: usize, y: u64, pre: Option<(u64, u64)>) -> Result<()> {
        match pre {
            Some((q, d)) if self.takes_q80(m, n) => launch_mvq8_ks(&mut self.g, m, m.ptr, 0, 0, q, d, m.cols, y, m.rows, m.rows, n, mvq_ks(m, m.rows, 1)),
            _ => self.mm(m, x, n, y),
        }
    }

    pub(super) fn rms(&mut self, x: u64, ldx: usize, y: u64, ldy: usize, d: usize, w: u64, n: usize) -> Result<()> { self.rms_q(x, ldx, y, ldy, d, w, n, None) }

    /// `rms`, also writing the Q8_0 copy `q8` (values, scales) of the output rows (d % 32 == 0).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rms_q(&mut self, x: u64, ldx: usize, y: u64, ldy: usize, d: usize, w: u64, n: usize, q8: Option<(u64, u64)>) -> Result<()> {
        let eps = self.cfg.rms_eps;
        // Few rows (decode): a whole SM per row; many rows: 256 threads each.
        let threads = if n < 64 { 1024 } else { 256 };
        let (q, qd) = q8.filter(|_| d % 32 == 0).unwrap_or((0, 0));
        self.g.launch("rms_rows", (n as u32, 1, 1), threads, 0, &[A::P(x), A::I(ldx as i32), A::P(y), A::I(ldy as i32), A::I(d as i32), A::P(w), A::F(eps), A::P(q), A::P(qd)])
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn nrq(&mut self, x: u64, ldx: usize, y: u64, ldy: usize, rows: usize, d: usize, norm: bool, w: u64, freqs: u64, pos_base: i64, div: usize, mul: usize, qat: i32) -> Result<()> {
        self.nrq_at(x, ldx, y, ldy, rows, d, norm, w, freqs, pos_base, div, mul, qat, 0)
    }

    /// `nrq` with the decode options: in decode mode the position is read on the device (`dpos`), and a
    /// nonzero `comp_ratio` makes the single row the compressor window closing at that position.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nrq_at(&mut self, x: u64, ldx: usize, y: u64, ldy: usize, rows: usize, d: usize, norm: bool, w: u64, freqs: u64, pos_base: i64, div: usize, mul: usize, qat: i32, comp_ratio: usize) -> Result<()> {
        let dp = self.dpos_arg();
        self.nrq_dp(x, ldx, y, ldy, rows, d, norm, w, freqs, pos_base, div, mul, qat, comp_ratio as i32, dp)
    }

    /// `nrq_at` with the position read at `dpos` (0: `pos_base`), as a decode step reads `dpos`. A
    /// negative `comp_ratio` reads one position per group of `div` rows (`dpos[row / div]`, batches).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nrq_dp(&mut self, x: u64, ldx: usize, y: u64, ldy: usize, rows: usize, d: usize, norm: bool, w: u64, freqs: u64, pos_base: i64, div: usize, mul: usize, qat: i32, comp_ratio: i32, dpos: u64) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let half = (self.cfg.rope_dim / 2) as i32;
        let smem = (d * 8 + 32 * 8 + d * 4) as u32;
        let args = [
            A::P(x),
            A::I(ldx as i32),
            A::P(y),
            A::I(ldy as i32),
            A::I(d as i32),
            A::I(norm as i32),
            A::P(w),
            A::F(self.cfg.rms_eps),
            A::P(freqs),
            A::I(half),
            A::L(pos_base),
            A::I(div as i32),
            A::I(mul as i32),
            A::I(qat),
            A::P(dpos),
            A::I(comp_ratio),
        ];
        self.g.launch("norm_rope_qat", (rows as u32, 1, 1), d as u32, smem, &args)
    }

    /// Sub-layer entry: mix projection of the raw streams, then one fused kernel for the flat RMS
    /// factor, Sinkhorn, the collapse and the sub-layer norm (weight `norm`) into `xn`. `want` names the
    /// int8 copies of xn the products after it can take; the return value says which were written.
    pub(super) fn hc_pre(&mut self, hc_fn: DM, scale: u64, base: u64, norm: u64, n: usize, want: XnCopies) -> Result<XnCopies> {
        let c = &self.cfg;
        let (e, nh) = (c.n_embd, c.n_hc);
        if nh > 16 || nh * nh > 32 {
            return Err(format!("{nh} hyper-connection streams (the fused kernel handles up to 5)"));
        }
        let (x, mix, mixes, xn) = (self.wk.x.ptr, self.wk.mix.ptr, self.wk.mixes.ptr, self.wk.xn.ptr);
        let hd = nh * e;
        let fused = hc_fn.ty == GgmlType::F16 && !hc_fn.split && hc_fn.cols == hd && hd % 256 == 0 && e % 256 == 0 && e <= 8192;
        if self.decode_mode && n == 1 && fused {
            return self.hc_pre_dec(hc_fn, scale, base, norm, want);
        }
        if self.exact && fused {
            return self.hc_pre_rows(hc_fn, scale, base, norm, n, want);
        }
        self.flush_exit()?;
        self.mm(&hc_fn, x, n, mix)?;
        let args = [
            A::P(mix),
            A::P(scale),
            A::P(base),
            A::I(nh as i32),
            A::I(self.cfg.sinkhorn_iters as i32),
            A::F(self.cfg.hc_eps),
            A::P(x),
            A::I(e as i32),
            A::P(mixes),
            A::P(norm),
            A::F(self.cfg.rms_eps),
            A::P(xn),
            A::I(!(self.decode_mode || self.exact) as i32),
        ];
        if self.decode_mode || self.exact {
            // The Sinkhorn matrix is only read by hc_post: off the critical path, on side stream 1
            // (joined before hc_post by the sub-layer's branch joins; a batched step has none: in order).
            let (it, he, re) = (self.cfg.sinkhorn_iters as i32, self.cfg.hc_eps, self.cfg.rms_eps);
            if self.decode_mode {
                self.g.fork(1)?;
            }
            let cargs = [A::P(mix), A::P(scale), A::P(base), A::I(nh as i32), A::I(it), A::F(he), A::P(x), A::I(e as i32), A::P(mixes), A::F(re)];
            self.g.launch("hc_comb", (n as u32, 1, 1), 1024, 0, &cargs)?;
            if self.decode_mode {
                self.g.to_main();
            }
        }
        self.g.launch("hc_pre_norm", (n as u32, 1, 1), 1024, (e * 4) as u32, &args)?;
        if !(self.decode_mode || self.exact) {
            // Prefill: the Sinkhorn matrices a warp a token, from the RMS factors hc_pre_norm kept.
            let cargs = [A::P(mix), A::P(scale), A::P(base), A::I(nh as i32), A::I(self.cfg.sinkhorn_iters as i32), A::F(self.cfg.hc_eps), A::P(mixes), A::I(n as i32)];
            self.g.launch("hc_comb_rows", (n.div_ceil(8) as u32, 1, 1), 256, 0, &cargs)?;
        }
        Ok(XnCopies::default())
    }

    /// One-token sub-layer entry in one launch (`hc_entry_dec`: the pending exit first, every block
    /// finishing its own columns behind one grid barrier), then the Sinkhorn matrix on side stream 1.
    fn hc_pre_dec(&mut self, hc_fn: DM, scale: u64, base: u64, norm: u64, want: XnCopies) -> Result<XnCopies> {
        let e = self.cfg.n_embd;
        let made = XnCopies { q80: want.q80 && self.fast_q8, q8k: want.q8k && self.fast_experts };
        let (q80, d80) = if made.q80 { self.wk.q8_xn.pair() } else { (0, 0) };
        let (q8k, d8k) = if made.q8k { self.wk.q8k_xn.pair() } else { (0, 0) };
        let exit = self.pend.take();
        let entry = Entry { hc_fn, scale, base, norm, copies: [q80, d80, q8k, d8k], bar: self.wk.hcd_bar.ptr, exit };
        let all = self.entry_args(&entry, 0);
        self.g.launch("hc_entry_dec", ((e / 256) as u32, 1, 1), 256, 0, &all)?;
        self.hc_comb_side(scale, base, made)
    }

    /// The arguments of an `hc_entry_dec` launch whose first token is row `row` of the work buffers:
    /// mix weights, streams, slice records and barrier, HC scale and base, raw mix, mixes, norm
    /// weight, xn and its int8 copies; the pending exit.
    pub(super) fn entry_args(&self, en: &Entry, row: usize) -> [A; 23] {
        let c = &self.cfg;
        let (e, nh) = (c.n_embd, c.n_hc);
        let at = |p: u64, floats: usize| p + (row * floats * 4) as u64;
        // The int8 copies: `e` values and e/32 (Q8_0) or e/256 (Q8_K) scales a row; 0 stays 0.
        let copy_at = |p: u64, bytes: usize| if p == 0 { 0 } else { p + (row * bytes) as u64 };
        let [q80, d80, q8k, d8k] = en.copies;
        let (q80, d80, q8k, d8k) = (copy_at(q80, e), copy_at(d80, e / 32 * 4), copy_at(q8k, e), copy_at(d8k, e / 256 * 4));
        let (xmode, ey, ek, eadd) = match en.exit {
            None => (0, 0, 0, 0),
            Some(PendingExit::Attn) => (1, at(self.wk.y.ptr, e), 0, 0),
            Some(PendingExit::Ffn { rows, k, add }) => (2, at(rows, k * e), k, if add != 0 { at(add, e) } else { 0 }),
        };
        let head = [
            A::P(en.hc_fn.ptr),
            A::I(en.hc_fn.rows as i32),
            A::P(at(self.wk.x.ptr, nh * e)),
            A::I(e as i32),
            A::I(nh as i32),
            A::P(self.wk.hcd_part.ptr),
            A::P(en.bar),
            A::P(en.scale),
            A::P(en.base),
            A::F(c.hc_eps),
            A::P(at(self.wk.mix.ptr, c.hc_mix())),
            A::P(at(self.wk.mixes.ptr, nh + nh * nh)),
            A::P(en.norm),
            A::F(c.rms_eps),
            A::P(at(self.wk.xn.ptr, e)),
            A::P(q80),
            A::P(d80),
            A::P(q8k),
            A::P(d8k),
        ];
        let mut all = [A::P(0); 23];
        all[..19].copy_from_slice(&head);
        all[19..].copy_from_slice(&[A::I(xmode), A::P(ey), A::I(ek as i32), A::P(eadd)]);
        all
    }

    /// The Sinkhorn matrix of the entry just launched, on side stream 1 (only the exit reads it).
    fn hc_comb_side(&mut self, scale: u64, base: u64, made: XnCopies) -> Result<XnCopies> {
        let e = self.cfg.n_embd;
        let (nh, x, mix, mixes) = (self.cfg.n_hc, self.wk.x.ptr, self.wk.mix.ptr, self.wk.mixes.ptr);
        let (it, he, re) = (self.cfg.sinkhorn_iters as i32, self.cfg.hc_eps, self.cfg.rms_eps);
        self.g.fork(1)?;
        let cargs = [A::P(mix), A::P(scale), A::P(base), A::I(nh as i32), A::I(it), A::F(he), A::P(x), A::I(e as i32), A::P(mixes), A::F(re)];
        self.g.launch("hc_comb", (1, 1, 1), 1024, 0, &cargs)?;
        self.g.to_main();
        Ok(made)
    }

    /// Whether a sub-layer exit of `n` tokens is left to the next entry kernel (decode; exact rows,
    /// whose entries run the decode entry per row).
    fn folds_exit(&self, n: usize) -> bool { self.decode_mode && n == 1 || self.exact }

    /// The attention sub-layer's exit (HC post with the attention output `wk.y`), or its deferral.
    pub(super) fn exit_attn(&mut self, n: usize) -> Result<()> {
        if self.folds_exit(n) {
            self.pend = Some(PendingExit::Attn);
            self.pend_rows = n;
            return Ok(());
        }
        self.hc_post(n)
    }

    /// The FFN sub-layer's exit (combination of the `k` weighted expert rows at `rows`, row order
    /// `slot_pos` or token-major, plus `add`, then HC post), or its deferral (one token).
    pub(super) fn exit_ffn(&mut self, n: usize, rows: u64, slot_pos: u64, k: usize, add: u64) -> Result<()> {
        if self.folds_exit(n) && slot_pos == 0 {
            self.pend = Some(PendingExit::Ffn { rows, k, add });
            self.pend_rows = n;
            return Ok(());
        }
        self.moe_combine_post(n, rows, slot_pos, k, add)
    }

    /// Applies a pending exit with the stand-alone kernel (before anything reads the streams).
    pub(super) fn flush_exit(&mut self) -> Result<()> {
        let n = self.pend_rows.max(1);
        match self.pend.take() {
            None => Ok(()),
            Some(PendingExit::Attn) => self.hc_post(n),
            Some(PendingExit::Ffn { rows, k, add }) => self.moe_combine_post(n, rows, 0, k, add),
        }
    }

    fn hc_post(&mut self, n: usize) -> Result<()> {
        let e = self.cfg.n_embd;
        let args = [A::P(self.wk.mixes.ptr), A::I(self.cfg.n_hc as i32), A::P(self.wk.y.ptr), A::P(self.wk.x.ptr), A::I(e as i32)];
        self.g.launch("hc_post", (cdiv(e, 256), n as u32, 1), 256, 0, &args)
    }

    fn moe_combine_post(&mut self, n: usize, rows: u64, slot_pos: u64, k: usize, add: u64) -> Result<()> {
        let e = self.cfg.n_embd;
        let args = [A::P(rows), A::P(slot_pos), A::I(k as i32), A::P(add), A::P(self.wk.mixes.ptr), A::I(self.cfg.n_hc as i32), A::P(self.wk.x.ptr), A::I(e as i32)];
        self.g.launch("moe_combine_post", (cdiv(e, 256), n as u32, 1), 256, 0, &args)
    }


    /// The head's collapse of rows `r0..r0 + m` of the streams into `cur`, normalised.
    pub(super) fn head_norm(&mut self, r0: usize, m: usize) -> Result<()> {
        let cfg = self.cfg.clone();
        let (hd, e, nh) = (cfg.hc_dim(), cfg.n_embd, cfg.n_hc);
        let h = self.head.as_ref().ok_or("the stage has no output head")?;
        let (hc_fn, sc, base, norm) = (h.hc_fn, h.hc_scale, h.hc_base, h.norm);
        let x = self.wk.x.ptr + (r0 * hd * 4) as u64;
        let (flat, mix, cur) = (self.wk.flat.ptr, self.wk.mix.ptr, self.wk.cur.ptr);
        self.rms(x, hd, flat, hd, hd, 0, m)?;
        self.mm(&hc_fn, flat, m, mix)?;
        let args = [A::P(mix), A::P(sc), A::P(base), A::F(cfg.hc_eps), A::P(x), A::I(nh as i32), A::I(e as i32), A::P(cur)];
        self.g.launch("head_collapse", (m as u32, cdiv(e, 256), 1), 256, 0, &args)?;
        self.rms(cur, e, cur, e, e, norm, m)
    }

    /// Logits of the `m` rows `head_norm` left in `cur`.
    pub(super) fn head_logits(&mut self, m: usize) -> Result<()> {
        let output = self.head.as_ref().ok_or("the stage has no output head")?.output;
        let (cur, logits) = (self.wk.cur.ptr, self.wk.logits.ptr);
        self.mm(&output, cur, m, logits)
    }
}
