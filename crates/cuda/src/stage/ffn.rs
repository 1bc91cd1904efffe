//! The MoE feed-forward ops on CUDA: router, routed experts (read by id for one token, grouped by
//! expert for a batch), shared expert, combination.
use super::*;
use crate::gpu::SIDE_STREAMS;
use crate::matvec::{grouped_direct, launch_moe_gemm, launch_dq, launch_mvq8, launch_mvq8_ks, launch_mvq8_shared, launch_q8k, mvq_ks, q8_ok};

impl CudaOps {
    /// The FFN sub-layer's entry (xn and the int8 copies the expert products take).
    pub(super) fn ffn_entry(&mut self, li: usize, n: usize) -> Result<()> {
        let l = &self.layers[li];
        let (hc_fn, hsc, hba, fnw) = (l.hc_ffn.fn_, l.hc_ffn.scale, l.hc_ffn.base, l.ffn_norm);
        let q8k_exp = [&l.gate_exps, &l.up_exps, &l.down_exps].iter().all(|m| q8_ok(m));
        let has_shared = l.shared.is_some();
        let xc = self.hc_pre(hc_fn, hsc, hba, fnw, n, XnCopies { q80: has_shared, q8k: q8k_exp });
        self.ls = LayerStep { xc: xc?, ..LayerStep::default() };
        Ok(())
    }

    /// The shared expert: gate and up products, SwiGLU, down.
    pub(super) fn shared_expert(&mut self, li: usize, s: Step) -> Result<()> {
        let n = s.n;
        let ff = self.cfg.ff_exp;
        let l = &self.layers[li];
        let ([sg, su, sd], clamp) = (l.shared.ok_or("layer without a shared expert")?, l.clamp);
        let (xn, sh_a, sh_b, sh_out) = (self.wk.xn.ptr, self.wk.sh_a.ptr, self.wk.sh_b.ptr, self.wk.sh_out.ptr);
        let pre_xn = self.ls.xc.q80.then(|| self.wk.q8_xn.pair());
        self.mm_q(&sg, xn, n, sh_a, pre_xn)?;
        self.mm_q(&su, xn, n, sh_b, pre_xn)?;
        // The SwiGLU writes the Q8_0 copy the down product takes (one token, Precision::Fast).
        let pre_sh = (self.takes_q80(&sd, n) && ff % 256 == 0).then(|| self.wk.q8_sh.pair());
        let (q, qd) = pre_sh.unwrap_or((0, 0));
        self.g.launch("swiglu", (cdiv(n * ff, 256), 1, 1), 256, 0, &[A::P(sh_a), A::P(sh_b), A::P((n * ff) as u64), A::I(ff as i32), A::F(clamp), A::P(0), A::P(q), A::P(qd), A::P(0), A::P(0)])?;
        self.mm_q(&sd, sh_a, n, sh_out, pre_sh)?;
        self.ls.shared_out = sh_out;
        Ok(())
    }

    /// Gate logits and routing: decode and exact rows in one launch where the shapes allow
    /// (`gate_route_dec`, the last block of a row routes it; on the main lane while the shared expert
    /// runs on lane 1), else the products then `route`.
    pub(super) fn route(&mut self, li: usize, s: Step) -> Result<()> {
        let (e, ne, k) = (self.cfg.n_embd, self.cfg.n_expert, self.cfg.n_expert_used);
        if ne > 1024 || k > 16 {
            return Err("router supports up to 1024 experts and 16 per token".into());
        }
        let gate_inp = self.layers[li].gate_inp;
        let dec_route = gate_inp.ty == GgmlType::F16 && !gate_inp.split && ne <= 256 && ne % 4 == 0 && e % 16 == 0;
        if (self.decode_mode && s.n == 1 || self.exact) && dec_route {
            return self.route_rows(li, s.n);
        }
        self.router(li, s.n)
    }

    /// The routed experts: one token reads the chosen experts' matrices straight from the stacks (ids
    /// stay on the device; int8 activations under `fast_experts`); a batch groups tokens by expert.
    pub(super) fn experts(&mut self, li: usize, s: Step) -> Result<()> {
        let n = s.n;
        let (e, k, ff) = (self.cfg.n_embd, self.cfg.n_expert_used, self.cfg.ff_exp);
        let l = &self.layers[li];
        let (gate, up, down, clamp) = (l.gate_exps, l.up_exps, l.down_exps, l.clamp);
        if n > 1 && s.batch {
            return self.experts_rows(n, gate, up, down, clamp);
        }
        if n > 1 {
            self.experts_grouped(n, gate, up, down, clamp)?;
            self.ls.slot_pos = self.wk.slot_pos.ptr;
            return Ok(());
        }
        let dec = self.decode_mode;
        let wk = &self.wk;
        let (xn, eids, ew, ex_a, ex_b, ex_out) = (wk.xn.ptr, wk.eids.ptr, wk.ew.ptr, wk.ex_a.ptr, wk.ex_b.ptr, wk.ex_out.ptr);
        let q8 = self.fast_experts && [&gate, &up, &down].iter().all(|m| q8_ok(m));
        let (xq, xd) = (self.wk.xq.ptr, self.wk.xqd.ptr);
        // The Q8_K copy of xn: written by the fused sub-layer entry, or quantized here.
        let (xnq, xnd) = if self.ls.xc.q8k { self.wk.q8k_xn.pair() } else { (xq, xd) };
        if q8 && !self.ls.xc.q8k {
            launch_q8k(&mut self.g, xn, e, e, 1, xq, xd)?;
        }
        if dec {
            self.g.fork(2)?;
        }
        if q8 {
            launch_mvq8(&mut self.g, &up, up.ptr, up.mat_bytes(), eids, xnq, xnd, 0, ex_b, ff, ff, k)?;
        } else {
            self.mv(up.ptr, &up, up.mat_bytes(), eids, xn, e, 0, ex_b, ff, ff, ff, 1, k)?;
        }
        if dec {
            self.g.to_main();
        }
        if q8 {
            launch_mvq8(&mut self.g, &gate, gate.ptr, gate.mat_bytes(), eids, xnq, xnd, 0, ex_a, ff, ff, k)?;
        } else {
            self.mv(gate.ptr, &gate, gate.mat_bytes(), eids, xn, e, 0, ex_a, ff, ff, ff, 1, k)?;
        }
        if dec {
            self.g.join(2)?;
        }
        // With int8 activations the SwiGLU also writes the Q8_K copy the down product takes (the up
        // product on the side stream has been joined: the buffer is free again).
        let (sq, sd) = if q8 && ff % 256 == 0 { (xq, xd) } else { (0, 0) };
        self.g.launch("swiglu", (cdiv(k * ff, 256), 1, 1), 256, 0, &[A::P(ex_a), A::P(ex_b), A::P((k * ff) as u64), A::I(ff as i32), A::F(clamp), A::P(ew), A::P(0), A::P(0), A::P(sq), A::P(sd)])?;
        if q8 {
            if sq == 0 {
                launch_q8k(&mut self.g, ex_a, ff, ff, k, xq, xd)?;
            }
            launch_mvq8(&mut self.g, &down, down.ptr, down.mat_bytes(), eids, xq, xd, ff, ex_out, e, e, k)?;
        } else {
            self.mv(down.ptr, &down, down.mat_bytes(), eids, ex_a, ff, ff, ex_out, e, e, e, 1, k)?;
        }
        Ok(())
    }

    /// A batched step's routed experts (one token per row): slot j = r·k + i reads expert eids[j] with
    /// row r's activations through the one-token kernels, as a decode step does with its k slots (the
    /// int8 products with the decode step's K split), all rows' slots in one launch per matrix. No
    /// host round trip (the grouped path reads the expert counts back), and the expert outputs stay
    /// token-major for the combination.
    fn experts_rows(&mut self, n: usize, gate: DM, up: DM, down: DM, clamp: f32) -> Result<()> {
        let (e, k, ff) = (self.cfg.n_embd, self.cfg.n_expert_used, self.cfg.ff_exp);
        let z = n * k;
        if n > self.batch_cap {
            return Err(format!("batched experts: {n} rows exceed the {} rows a batched step holds", self.batch_cap));
        }
        let wk = &self.wk;
        let (xn, rep, eids, ew, gx, ex_a, ex_b, ex_out, xq, xd) = (wk.xn.ptr, wk.rep_tok.ptr, wk.eids.ptr, wk.ew.ptr, wk.gx.ptr, wk.ex_a.ptr, wk.ex_b.ptr, wk.ex_out.ptr, wk.xq.ptr, wk.xqd.ptr);
        let q8 = self.fast_experts && [&gate, &up, &down].iter().all(|m| q8_ok(m));
        if q8 {
            // Slot r·k + i reads row r's Q8_K copy (the entry's, or quantized here), as decode's k slots read one.
            let (xnq, xnd) = if self.ls.xc.q8k { self.wk.q8k_xn.pair() } else { (xq, xd) };
            if !self.ls.xc.q8k {
                launch_q8k(&mut self.g, xn, e, e, n, xq, xd)?;
            }
            launch_mvq8_shared(&mut self.g, &up, up.ptr, up.mat_bytes(), eids, xnq, xnd, e, k, ex_b, ff, ff, z, mvq_ks(&up, ff, k))?;
            launch_mvq8_shared(&mut self.g, &gate, gate.ptr, gate.mat_bytes(), eids, xnq, xnd, e, k, ex_a, ff, ff, z, mvq_ks(&gate, ff, k))?;
        } else {
            self.g.launch("gather_rows", (z as u32, 1, 1), 256, 0, &[A::P(xn), A::P(rep), A::P(gx), A::I(e as i32)])?;
            // The K split of decode's k slots: each slot sums as there.
            self.mv_split(up.ptr, &up, up.mat_bytes(), eids, gx, e, e, ex_b, ff, ff, ff, 1, z, k)?;
            self.mv_split(gate.ptr, &gate, gate.mat_bytes(), eids, gx, e, e, ex_a, ff, ff, ff, 1, z, k)?;
        }
        let (sq, sd) = if q8 && ff % 256 == 0 { (xq, xd) } else { (0, 0) };
        self.g.launch("swiglu", (cdiv(z * ff, 256), 1, 1), 256, 0, &[A::P(ex_a), A::P(ex_b), A::P((z * ff) as u64), A::I(ff as i32), A::F(clamp), A::P(ew), A::P(0), A::P(0), A::P(sq), A::P(sd)])?;
        if q8 {
            if sq == 0 {
                launch_q8k(&mut self.g, ex_a, ff, ff, z, xq, xd)?;
            }
            launch_mvq8_ks(&mut self.g, &down, down.ptr, down.mat_bytes(), eids, xq, xd, ff, ex_out, e, e, z, mvq_ks(&down, e, k))
        } else {
            self.mv_split(down.ptr, &down, down.mat_bytes(), eids, ex_a, ff, ff, ex_out, e, e, e, 1, z, k)
        }
    }

    /// Combination of the weighted expert rows plus the shared expert, and the sub-layer exit (in one
    /// launch, or in the next entry's).
    pub(super) fn ffn_exit(&mut self, s: Step) -> Result<()> {
        let (k, ex_out) = (self.cfg.n_expert_used, self.wk.ex_out.ptr);
        let (slot_pos, add) = (self.ls.slot_pos, self.ls.shared_out);
        self.exit_ffn(s.n, ex_out, slot_pos, k, add)
    }

    /// Arguments of the `route` kernel for layer `li` (gate logits in `rlog`).
    pub(super) fn route_args(&self, li: usize) -> [A; 10] {
        let cfg = &self.cfg;
        let l = &self.layers[li];
        [
            A::P(self.wk.rlog.ptr),
            A::I(cfg.n_expert as i32),
            A::P(l.exp_bias.unwrap_or(0)),
            A::P(l.tid2eid.unwrap_or(0)),
            A::P(self.wk.tokens.ptr),
            A::I(cfg.n_expert_used as i32),
            A::I(cfg.expert_weights_norm as i32),
            A::F(cfg.expert_weights_scale),
            A::P(self.wk.eids.ptr),
            A::P(self.wk.ew.ptr),
        ]
    }

    /// Gate logits of `n` tokens (`mm`), then one routing block per token.
    fn router(&mut self, li: usize, n: usize) -> Result<()> {
        let args = self.route_args(li);
        let bs = (self.cfg.n_expert.next_power_of_two()).clamp(32, 1024) as u32;
        let (gate_inp, xn, rlog) = (self.layers[li].gate_inp, self.wk.xn.ptr, self.wk.rlog.ptr);
        self.mm(&gate_inp, xn, n, rlog)?;
        self.g.launch("route", (n as u32, 1, 1), bs, 0, &args)
    }

    /// Prefill experts: tokens grouped by expert (counts read back once per layer), one GEMM (or
    /// mat-vec for small groups) per expert matrix over its tokens.
    pub(super) fn experts_grouped(&mut self, n: usize, gate: DM, up: DM, down: DM, clamp: f32) -> Result<()> {
        let (e, ne, k, ff) = (self.cfg.n_embd, self.cfg.n_expert, self.cfg.n_expert_used, self.cfg.ff_exp);
        let total = n * k;
        let wk = &self.wk;
        let (eids, ew, counts, cursor, slot_pos, gw, gtok, gx, xn, ex_a, ex_b, ex_out) =
            (wk.eids.ptr, wk.ew.ptr, wk.counts.ptr, wk.cursor.ptr, wk.slot_pos.ptr, wk.gw.ptr, wk.gtok.ptr, wk.gx.ptr, wk.xn.ptr, wk.ex_a.ptr, wk.ex_b.ptr, wk.ex_out.ptr);
        // SAFETY: counts holds ne ints on the device.
        unsafe { cudarc::driver::result::memset_d8_async(counts, 0, ne * 4, self.g.stream) }.map_err(|x| format!("{x:?}"))?;
        self.g.launch("moe_count", (cdiv(total, 256), 1, 1), 256, 0, &[A::P(eids), A::I(total as i32), A::P(counts)])?;
        let mut ch = std::mem::take(&mut self.counts_host);
        self.g.dtoh(&mut ch, counts)?;
        let mut offs = vec![0i32; ne];
        let mut acc = 0i32;
        for x in 0..ne {
            offs[x] = acc;
            acc += ch[x];
        }
        self.g.htod(cursor, &offs)?;
        self.g.launch("moe_scatter", (cdiv(total, 256), 1, 1), 256, 0, &[A::P(eids), A::P(ew), A::I(total as i32), A::I(k as i32), A::P(cursor), A::P(slot_pos), A::P(gw), A::P(gtok)])?;
        self.g.launch("gather_rows", (total as u32, 1, 1), 256, 0, &[A::P(xn), A::P(gtok), A::P(gx), A::I(e as i32)])?;
        let gmin = self.group_min(&[gate, up, down]);
        let any_gemm = ch.iter().any(|&c| c as usize >= gmin);
        let gxh = if any_gemm { self.to_f16(gx, e, total, e)? } else { 0 };
        self.expert_mats(&[(gate, ex_a), (up, ex_b)], gx, gxh, &ch, &offs, gmin)?;
        self.g.launch("swiglu", (cdiv(total * ff, 256), 1, 1), 256, 0, &[A::P(ex_a), A::P(ex_b), A::P((total * ff) as u64), A::I(ff as i32), A::F(clamp), A::P(gw), A::P(0), A::P(0), A::P(0), A::P(0)])?;
        let ah = if any_gemm { self.to_f16(ex_a, ff, total, ff)? } else { 0 };
        self.expert_mats(&[(down, ex_out)], ex_a, ah, &ch, &offs, gmin)?;
        self.counts_host = ch;
        Ok(())
    }


    /// Fewest tokens of an expert that take tensor cores: one when the grouped GEMM reads every
    /// matrix's blocks as stored (one launch a matrix for all experts; each small group on a mat-vec
    /// launch of its own took ~150 µs, ~770 launches a layer at a 512-token chunk), else `gemm_min`.
    /// A `gemm_min` raised above the default (tests keeping every product in f32) stays.
    fn group_min(&self, mats: &[DM]) -> usize {
        if self.all_grouped_direct(mats.iter()) && self.gemm_min <= GEMM_MIN { 1 } else { self.gemm_min }
    }

    /// Whether the grouped kernel takes every matrix as stored (no f16 copy, every expert in one launch).
    fn all_grouped_direct<'a>(&self, mut mats: impl Iterator<Item = &'a DM>) -> bool { self.grouped_gemm && mats.all(|m| grouped_direct(m).is_some()) }

    /// Per-expert products over the grouped token rows: for each expert with `m` tokens (rows
    /// `offs[x]..+m` of `x32`/`xh`), out = x · Wᵀ for every matrix in `mats`. Experts with at least
    /// `gmin` tokens take tensor cores: one grouped `moe_gemm*` launch per matrix kind over all of them
    /// (reading IQ2_XXS / Q2_K blocks as stored, or f16), or else (`grouped_gemm` false, as tests compare,
    /// or shapes the kernel does not take) a group of experts is dequantized by one launch per matrix into the expert
    /// scratch and its cuBLAS GEMMs run round-robin on the side streams (one GEMM of ~100 tokens leaves
    /// most SMs idle). Smaller groups take the quantized mat-vec.
    fn expert_mats(&mut self, mats: &[(DM, u64)], x32: u64, xh: u64, ch: &[i32], offs: &[i32], gmin: usize) -> Result<()> {
        let ne = ch.len();
        let nmat = mats.len();
        let use_gemm = |s: &Self, m: &DM| m.ty == GgmlType::F16 || m.rows * m.cols <= s.wk.ewh_slot;
        // Matrices the grouped kernel reads as stored need no f16 scratch: every expert in one group.
        let direct_all = self.all_grouped_direct(mats.iter().map(|(m, _)| m));
        let group = if direct_all { ne } else { (self.wk.ewh_slots / nmat).max(1) };
        let mut g0 = 0usize;
        while g0 < ne {
            let g1 = (g0 + group).min(ne);
            let big: Vec<usize> = (g0..g1).filter(|&x| ch[x] as usize >= gmin).collect();
            let bt = tile_tokens(&big, ch);
            let tiles = if self.grouped_gemm && (big.len() > 1 || direct_all && !big.is_empty()) { self.grouped_tiles(mats, &big, g0, offs, ch, bt) } else { None };
            let direct = |m: &DM| tiles.is_some() && grouped_direct(m).is_some();
            // One dequantization launch per matrix for the experts of the group that take a GEMM on
            // f16 slots.
            if let (Some(&lo), Some(&hi)) = (big.first(), big.last()) {
                for (j, (m, _)) in mats.iter().enumerate() {
                    if m.ty != GgmlType::F16 && use_gemm(self, m) && !direct(m) {
                        let src = m.ptr + (lo * m.mat_bytes()) as u64;
                        let dst = self.wk.ewh.ptr + ((j * group + lo - g0) * self.wk.ewh_slot * 2) as u64;
                        launch_dq(&mut self.g, m, src, dst, (hi + 1 - lo) * m.rows * m.cols)?;
                    }
                }
            }
            // The grouped launches run on the main stream; the remaining experts' mat-vecs beside
            // them on the side streams.
            let grouped = tiles.is_some();
            if let Some(tiles) = tiles {
                self.g.htod(self.wk.gptrs.ptr, &tiles)?;
                for (j, (mat, out)) in mats.iter().enumerate() {
                    let (name, w, ws) = match grouped_direct(mat) {
                        Some(name) => (name, mat.ptr + (g0 * mat.mat_bytes()) as u64, mat.mat_bytes()),
                        _ if mat.ty == GgmlType::F16 => ("moe_gemm", mat.ptr + (g0 * mat.mat_bytes()) as u64, mat.mat_bytes()),
                        _ => ("moe_gemm", self.wk.ewh.ptr + ((j * group) * self.wk.ewh_slot * 2) as u64, self.wk.ewh_slot * 2),
                    };
                    let args = [A::P(w), A::P(ws as u64), A::P(self.wk.gptrs.ptr), A::P(xh), A::P(*out), A::I(mat.cols as i32), A::I(mat.rows as i32), A::I(0)];
                    launch_moe_gemm(&mut self.g, name, bt, (tiles.len() as u32, (mat.rows / 128) as u32, 1), &args)?;
                }
            }
            self.g.fork_all()?;
            let mut turn = 0usize;
            for x in g0..g1 {
                let m = ch[x] as usize;
                if m == 0 || (grouped && m >= gmin) {
                    continue;
                }
                self.g.on(1 + turn % SIDE_STREAMS);
                turn += 1;
                let off = offs[x] as usize;
                for (j, (mat, out)) in mats.iter().enumerate() {
                    let (rows, cols) = (mat.rows, mat.cols);
                    let yo = out + (off * rows * 4) as u64;
                    if m >= gmin && use_gemm(self, mat) {
                        let wh = if mat.ty == GgmlType::F16 {
                            mat.ptr + (x * mat.mat_bytes()) as u64
                        } else {
                            self.wk.ewh.ptr + ((j * group + x - g0) * self.wk.ewh_slot * 2) as u64
                        };
                        self.g.gemm_f16(rows, m, cols, wh, cols, xh + (off * cols * 2) as u64, cols, yo, rows)?;
                    } else {
                        let w = mat.ptr + (x * mat.mat_bytes()) as u64;
                        self.mv(w, mat, 0, 0, x32 + (off * cols * 4) as u64, cols, 0, yo, rows, 0, rows, m, 1)?;
                    }
                }
            }
            self.g.join_all()?;
            g0 = g1;
        }
        Ok(())
    }

    /// Tiles of up to `bt` tokens of each expert in `big` (slot = expert - g0) for the grouped GEMM,
    /// or None when a matrix's shape does not suit the kernel or the tile list does not fit.
    fn grouped_tiles(&self, mats: &[(DM, u64)], big: &[usize], g0: usize, offs: &[i32], ch: &[i32], bt: usize) -> Option<Vec<[i32; 4]>> {
        let fits = |m: &DM| (m.ty == GgmlType::F16 || m.rows * m.cols <= self.wk.ewh_slot || grouped_direct(m).is_some()) && m.rows % 128 == 0 && m.cols % 64 == 0;
        if !mats.iter().all(|(m, _)| fits(m)) {
            return None;
        }
        let mut tiles: Vec<[i32; 4]> = Vec::new();
        for &x in big {
            let (off, m) = (offs[x], ch[x]);
            for t0 in (0..m).step_by(bt) {
                tiles.push([(x - g0) as i32, off + t0, (m - t0).min(bt as i32), 0]);
            }
        }
        (tiles.len() <= self.wk.gptr_cap).then_some(tiles)
    }
}

/// Tokens a grouped GEMM tile takes: 128 when the experts average more than 64 (each expert's
/// weights decoded once for up to 128 tokens instead of once per 64), else 64.
fn tile_tokens(big: &[usize], ch: &[i32]) -> usize {
    let tokens: usize = big.iter().map(|&x| ch[x] as usize).sum();
    if !big.is_empty() && tokens > 64 * big.len() { 128 } else { 64 }
}
