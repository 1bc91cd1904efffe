//! Op-level probes of the matrix kernels for tests and benchmarks: the mat-vec and GEMM paths on given
//! weights, mat-vec timing at given shapes, and the device's streaming read bandwidth.
use crate::gpu::{Gpu, Result, A};
use crate::matvec::{cdiv, grouped_direct, launch_dq, launch_mv, launch_mvq8, launch_q80, launch_q8k, split_layout, DM};
use crate::stage::me;
use ds4_gguf::GgmlType;

/// Op-level check of the matrix kernels: returns `y = x·Wᵀ` (n × rows) through the mat-vec kernel and
/// through dequantize + cuBLAS (the prefill path), for comparison with the CPU. With `split`, Q8_0 and
/// IQ2_XXS rows are first converted to the split layout (as at load), exercising the mv4 kernels.
pub fn matmul_paths(ty: GgmlType, rows: usize, cols: usize, data: &[u8], x: &[f32], n: usize, split: bool) -> ds4_model::Result<(Vec<f32>, Vec<f32>)> {
    (|| -> Result<(Vec<f32>, Vec<f32>)> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        let wb = g.alloc(data.len())?;
        g.htod(wb.ptr, data)?;
        let mut m = DM { ptr: wb.ptr, ty, rows, cols, n_mat: 1, row_bytes, split: false };
        if split {
            split_layout(&mut g, &mut m)?;
        }
        let xb = g.alloc(x.len() * 4)?;
        g.htod(xb.ptr, x)?;
        let y1 = g.alloc(n * rows * 4)?;
        let y2 = g.alloc(n * rows * 4)?;
        let wh = g.alloc(rows * cols * 2)?;
        let xh = g.alloc(n * cols * 2)?;
        launch_mv(&mut g, &m, wb.ptr, 0, 0, xb.ptr, cols, 0, y1.ptr, rows, 0, rows, n, 1)?;
        let whp = if ty == GgmlType::F16 {
            wb.ptr
        } else {
            launch_dq(&mut g, &m, wb.ptr, wh.ptr, rows * cols)?;
            wh.ptr
        };
        g.launch("f32_to_f16", (cdiv(n * cols, 256), 1, 1), 256, 0, &[A::P(xb.ptr), A::I(cols as i32), A::P(xh.ptr), A::I(n as i32), A::I(cols as i32)])?;
        g.gemm_f16(rows, n, cols, whp, cols, xh.ptr, cols, y2.ptr, rows)?;
        let mut a = vec![0f32; n * rows];
        let mut b = vec![0f32; n * rows];
        g.dtoh(&mut a, y1.ptr)?;
        g.dtoh(&mut b, y2.ptr)?;
        Ok((a, b))
    })()
    .map_err(me)
}

/// Op-level check of the int8-activation decode kernels (`Precision::Fast`): `data` holds `z`
/// matrices of `rows` × `cols` (`ty` Q2_K, or IQ2_XXS / Q8_0 converted to the split layout as at
/// load; Q8_0 takes Q8_0 activations, the others Q8_K), slot i reading matrix `z - 1 - i` by id; `x` is one activation row shared by every slot
/// (`x.len() == cols`) or one per slot. Returns y (z × rows), the activation values and scales.
pub fn matvec_fast_paths(ty: GgmlType, rows: usize, cols: usize, z: usize, data: &[u8], x: &[f32]) -> ds4_model::Result<(Vec<f32>, Vec<i8>, Vec<f32>)> {
    (|| -> Result<(Vec<f32>, Vec<i8>, Vec<f32>)> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        if data.len() != row_bytes * rows * z || (x.len() != cols && x.len() != cols * z) {
            return Err("matvec_fast_paths: bad sizes".into());
        }
        let wb = g.alloc(data.len())?;
        g.htod(wb.ptr, data)?;
        let mut m = DM { ptr: wb.ptr, ty, rows, cols, n_mat: z, row_bytes, split: false };
        split_layout(&mut g, &mut m)?;
        let xr = x.len() / cols;
        let xb = g.alloc(x.len() * 4)?;
        g.htod(xb.ptr, x)?;
        // Q8_0 activations carry a scale per 32 values, Q8_K per 256.
        let per = if ty == GgmlType::Q8_0 { 32 } else { 256 };
        let qb = g.alloc(x.len())?;
        let db = g.alloc(x.len() / per * 4)?;
        let yb = g.alloc(z * rows * 4)?;
        let eids: Vec<i32> = (0..z as i32).rev().collect();
        let eb = g.alloc(z * 4)?;
        g.htod(eb.ptr, &eids)?;
        let xq_z = if xr == 1 { 0 } else { cols };
        if ty == GgmlType::Q8_0 {
            launch_q80(&mut g, xb.ptr, cols, cols, xr, qb.ptr, db.ptr)?;
        } else {
            launch_q8k(&mut g, xb.ptr, cols, cols, xr, qb.ptr, db.ptr)?;
        }
        launch_mvq8(&mut g, &m, wb.ptr, m.mat_bytes(), eb.ptr, qb.ptr, db.ptr, xq_z, yb.ptr, rows, rows, z)?;
        let mut y = vec![0f32; z * rows];
        let mut q = vec![0i8; x.len()];
        let mut d = vec![0f32; x.len() / per];
        g.dtoh(&mut y, yb.ptr)?;
        g.dtoh(&mut q, qb.ptr)?;
        g.dtoh(&mut d, db.ptr)?;
        Ok((y, q, d))
    })()
    .map_err(me)
}

/// Op-level check of the grouped expert GEMM: `data` holds `counts.len()` expert matrices of `rows`
/// × `cols` (`ty` IQ2_XXS, converted to the split layout as at load, or Q2_K); expert e takes the
/// next `counts[e]` rows of `x` (f32, converted to f16 as in prefill). Returns Y (tokens × rows)
/// from the kernel reading the blocks as stored and from dequantize-to-f16 + the f16 kernel.
pub fn grouped_gemm_paths(ty: GgmlType, rows: usize, cols: usize, counts: &[usize], data: &[u8], x: &[f32]) -> ds4_model::Result<(Vec<f32>, Vec<f32>)> {
    (|| -> Result<(Vec<f32>, Vec<f32>)> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let ne = counts.len();
        let total: usize = counts.iter().sum();
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        if data.len() != row_bytes * rows * ne || x.len() != total * cols {
            return Err("grouped_gemm_paths: bad sizes".into());
        }
        let wb = g.alloc(data.len())?;
        g.htod(wb.ptr, data)?;
        let mut m = DM { ptr: wb.ptr, ty, rows, cols, n_mat: ne, row_bytes, split: false };
        split_layout(&mut g, &mut m)?;
        let name = grouped_direct(&m).ok_or("no direct grouped kernel for this type and shape")?;
        let xb = g.alloc(x.len() * 4)?;
        g.htod(xb.ptr, x)?;
        let xh = g.alloc(x.len() * 2)?;
        g.launch("f32_to_f16", (cdiv(x.len(), 256), 1, 1), 256, 0, &[A::P(xb.ptr), A::I(cols as i32), A::P(xh.ptr), A::I(total as i32), A::I(cols as i32)])?;
        let mut tiles: Vec<[i32; 4]> = Vec::new();
        let mut off = 0usize;
        for (e, &c) in counts.iter().enumerate() {
            for t0 in (0..c).step_by(64) {
                tiles.push([e as i32, (off + t0) as i32, (c - t0).min(64) as i32, 0]);
            }
            off += c;
        }
        let tb = g.alloc(tiles.len().max(1) * 16)?;
        g.htod(tb.ptr, &tiles)?;
        let wh = g.alloc(ne * rows * cols * 2)?;
        launch_dq(&mut g, &m, wb.ptr, wh.ptr, ne * rows * cols)?;
        let (y1, y2) = (g.alloc(total * rows * 4)?, g.alloc(total * rows * 4)?);
        let grid = (tiles.len() as u32, (rows / 128) as u32, 1);
        g.launch(name, grid, 256, 0, &[A::P(wb.ptr), A::P(m.mat_bytes() as u64), A::P(tb.ptr), A::P(xh.ptr), A::P(y1.ptr), A::I(cols as i32), A::I(rows as i32), A::I(0)])?;
        g.launch("moe_gemm", grid, 256, 0, &[A::P(wh.ptr), A::P((rows * cols * 2) as u64), A::P(tb.ptr), A::P(xh.ptr), A::P(y2.ptr), A::I(cols as i32), A::I(rows as i32), A::I(0)])?;
        let (mut a, mut b) = (vec![0f32; total * rows], vec![0f32; total * rows]);
        g.dtoh(&mut a, y1.ptr)?;
        g.dtoh(&mut b, y2.ptr)?;
        Ok((a, b))
    })()
    .map_err(me)
}

/// Seconds per int8-activation mat-vec call (one token, `z` slots of `rows` × `cols`; arbitrary
/// weights), timed with CUDA events over `reps` launches; the activation quantization is not timed.
pub fn bench_matvec_fast(ty: GgmlType, rows: usize, cols: usize, z: usize, reps: usize) -> ds4_model::Result<f64> {
    (|| -> Result<f64> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        let (wb, m) = zero_stack(&mut g, ty, rows, cols, z, row_bytes)?;
        let qb = g.alloc_zeroed(cols)?;
        let db = g.alloc_zeroed(cols / 32 * 4)?;
        let yb = g.alloc_zeroed(rows * z * 4)?;
        let eids: Vec<i32> = (0..z as i32).collect();
        let eb = g.alloc(z * 4)?;
        g.htod(eb.ptr, &eids)?;
        let run = |g: &mut Gpu| launch_mvq8(g, &m, wb.ptr, m.mat_bytes(), eb.ptr, qb.ptr, db.ptr, 0, yb.ptr, rows, rows, z);
        run(&mut g)?;
        g.time(reps, run)
    })()
    .map_err(me)
}

/// Seconds per mat-vec call (one token) of the kernel the stage would use for a `ty` matrix stack of
/// `z` slots of `rows` × `cols` (weights are arbitrary bytes: only the timing is of interest), timed
/// with CUDA events over `reps` back-to-back launches.
pub fn bench_matvec(ty: GgmlType, rows: usize, cols: usize, z: usize, reps: usize) -> ds4_model::Result<f64> {
    (|| -> Result<f64> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        let (wb, m) = zero_stack(&mut g, ty, rows, cols, z, row_bytes)?;
        let xb = g.alloc_zeroed(cols * 4)?;
        let yb = g.alloc_zeroed(rows * z * 4)?;
        let eids: Vec<i32> = (0..z as i32).collect();
        let eb = g.alloc(z * 4)?;
        g.htod(eb.ptr, &eids)?;
        let ep = if z > 1 { eb.ptr } else { 0 };
        let run = |g: &mut Gpu| launch_mv(g, &m, wb.ptr, m.mat_bytes(), ep, xb.ptr, cols, 0, yb.ptr, rows, rows, rows, 1, z);
        run(&mut g)?;
        g.time(reps, run)
    })()
    .map_err(me)
}

/// Seconds per f16 cuBLAS GEMM Y (n × m) = X (n × k) · Wᵀ (the prefill product), timed with CUDA
/// events over `reps` back-to-back calls, and host seconds per call to issue them.
pub fn bench_gemm(m: usize, n: usize, k: usize, reps: usize) -> ds4_model::Result<(f64, f64)> {
    (|| -> Result<(f64, f64)> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let (w, x, y) = (g.alloc_zeroed(m * k * 2)?, g.alloc_zeroed(n * k * 2)?, g.alloc_zeroed(n * m * 4)?);
        let run = |g: &mut Gpu| g.gemm_f16(m, n, k, w.ptr, k, x.ptr, k, y.ptr, m);
        run(&mut g)?;
        g.sync()?;
        let t0 = std::time::Instant::now();
        let gpu = g.time(reps, run)?;
        Ok((gpu, t0.elapsed().as_secs_f64() / reps as f64))
    })()
    .map_err(me)
}

/// A zeroed stack of `z` matrices in the layout the stage uses (split where it splits), for timing.
fn zero_stack(g: &mut Gpu, ty: GgmlType, rows: usize, cols: usize, z: usize, row_bytes: usize) -> Result<(crate::gpu::DBuf, DM)> {
    let wb = g.alloc_zeroed(row_bytes * rows * z)?;
    let mut m = DM { ptr: wb.ptr, ty, rows, cols, n_mat: z, row_bytes, split: false };
    split_layout(g, &mut m)?;
    Ok((wb, m))
}

/// Seconds to stream-read `bytes` of device memory once (the achievable read bandwidth).
pub fn bench_read(bytes: usize, reps: usize) -> ds4_model::Result<f64> {
    (|| -> Result<f64> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let b = g.alloc_zeroed(bytes)?;
        let o = g.alloc_zeroed(4)?;
        let blocks = (g.sms as u32).max(1) * 8;
        let run = |g: &mut Gpu| g.launch("read_sum", (blocks, 1, 1), 512, 0, &[A::P(b.ptr), A::P((bytes / 16) as u64), A::P(o.ptr)]);
        run(&mut g)?;
        g.time(reps, run)
    })()
    .map_err(me)
}


/// Inputs of one prefill attention call for [`attention_paths`]: `n` tokens at positions
/// `pos0..pos0+n`, `nh` heads of `d` dims; the window's rows before `pos0` come from `ring`
/// (`swa` rows, position p at row p % swa), later ones from `kvb`; compressed rows `comp`
/// (`(pos + 1) / ratio` of them visible to position pos), or the `topk` per token listed in `sel`.
pub struct AttnCase<'a> {
    pub n: usize,
    pub nh: usize,
    pub d: usize,
    pub pos0: usize,
    pub swa: usize,
    pub ratio: usize,
    pub topk: usize,
    pub q: &'a [f32],
    pub kvb: &'a [f32],
    pub ring: &'a [f32],
    pub comp: &'a [f32],
    pub sel: Option<&'a [i32]>,
    pub sinks: &'a [f32],
    pub freqs: &'a [f64],
}

/// Op-level check of prefill attention: the output (n × nh × d, inverse rope applied) of the f32
/// kernel and of the tensor-core kernel with `tc_heads` heads per block (64 or 32).
pub fn attention_paths(c: &AttnCase, tc_heads: usize) -> ds4_model::Result<(Vec<f32>, Vec<f32>)> {
    (|| -> Result<(Vec<f32>, Vec<f32>)> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let up = |g: &Gpu, v: &[f32]| -> Result<crate::gpu::DBuf> {
            let b = g.alloc(v.len().max(1) * 4)?;
            if !v.is_empty() {
                g.htod(b.ptr, v)?;
            }
            Ok(b)
        };
        let (q, kvb, ring, comp, sinks) = (up(&g, c.q)?, up(&g, c.kvb)?, up(&g, c.ring)?, up(&g, c.comp)?, up(&g, c.sinks)?);
        let fr = g.alloc(c.freqs.len().max(1) * 8)?;
        g.htod(fr.ptr, c.freqs)?;
        let sel = g.alloc(c.sel.map_or(1, |s| s.len()) * 4)?;
        if let Some(s) = c.sel {
            g.htod(sel.ptr, s)?;
        }
        let selp = if c.sel.is_some() { sel.ptr } else { 0 };
        let out = c.n * c.nh * c.d;
        let (o1, o2) = (g.alloc(out * 4)?, g.alloc(out * 4)?);
        let half = (c.freqs.len()) as i32;
        // f32 kernel: 16 heads per block when the scores fit, as the stage chooses.
        let ncand = c.swa.min(c.pos0 + c.n) + if c.sel.is_some() { c.topk } else { (c.pos0 + c.n) / c.ratio.max(1) };
        let smem = ((16 * (c.d + ncand)) * 4) as u32;
        let args = [
            A::P(q.ptr), A::P(kvb.ptr), A::P(ring.ptr), A::P(comp.ptr), A::P(selp), A::P(sinks.ptr), A::P(o1.ptr), A::I(c.nh as i32), A::I(c.d as i32),
            A::L(c.pos0 as i64), A::I(c.swa as i32), A::I(c.ratio as i32), A::I(c.topk as i32), A::P(fr.ptr), A::I(half),
        ];
        g.launch("attn_h16", (c.n as u32, (c.nh / 16) as u32, 1), 256, smem, &args)?;
        let smem = ((tc_heads + 32) * 520 * 2 + tc_heads * 36 * 4) as u32;
        let args = [
            A::P(q.ptr), A::P(kvb.ptr), A::P(ring.ptr), A::P(comp.ptr), A::P(selp), A::P(sinks.ptr), A::P(o2.ptr), A::I(c.nh as i32),
            A::L(c.pos0 as i64), A::I(c.swa as i32), A::I(c.ratio as i32), A::I(c.topk as i32), A::P(fr.ptr), A::I(half),
        ];
        g.launch(if tc_heads == 64 { "attn_tc64" } else { "attn_tc32" }, (c.n as u32, (c.nh / tc_heads) as u32, 1), 256, smem, &args)?;
        let mut a = vec![0f32; out];
        let mut b = vec![0f32; out];
        g.dtoh(&mut a, o1.ptr)?;
        g.dtoh(&mut b, o2.ptr)?;
        Ok((a, b))
    })()
    .map_err(me)
}

/// Op-level check of the indexer scores for `n` tokens at positions `pos0..` (64 heads of 128 dims;
/// `keys` holds the compressed rows): the scores (n × ldsc, ldsc = rows of `keys`) of the f32 kernel
/// and of the tensor-core kernel; rows of tokens with at most `topk` candidates are left at zero.
pub fn indexer_paths(q: &[f32], wts: &[f32], keys: &[f32], n: usize, pos0: usize, ratio: usize, topk: usize) -> ds4_model::Result<(Vec<f32>, Vec<f32>)> {
    (|| -> Result<(Vec<f32>, Vec<f32>)> {
        let (h, d) = (64usize, 128usize);
        let ldsc = keys.len() / d;
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let up = |g: &Gpu, v: &[f32]| -> Result<crate::gpu::DBuf> {
            let b = g.alloc(v.len() * 4)?;
            g.htod(b.ptr, v)?;
            Ok(b)
        };
        let (qb, wb, kb) = (up(&g, q)?, up(&g, wts)?, up(&g, keys)?);
        let (s1, s2) = (g.alloc_zeroed(n * ldsc * 4)?, g.alloc_zeroed(n * ldsc * 4)?);
        let smem = ((h * (d + 1) + 16 * d + 16 * 8) * 4) as u32;
        let args = [A::P(qb.ptr), A::P(wb.ptr), A::P(kb.ptr), A::P(s1.ptr), A::I(ldsc as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(topk as i32), A::I(h as i32), A::I(d as i32), A::P(0)];
        g.launch("idx_scores", (cdiv(ldsc, 16), n as u32, 1), 256, smem, &args)?;
        let args = [A::P(qb.ptr), A::P(wb.ptr), A::P(kb.ptr), A::P(s2.ptr), A::I(ldsc as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(topk as i32)];
        g.launch("idx_scores_tc", (cdiv(ldsc, 64), n as u32, 1), 128, 0, &args)?;
        let mut a = vec![0f32; n * ldsc];
        let mut b = vec![0f32; n * ldsc];
        g.dtoh(&mut a, s1.ptr)?;
        g.dtoh(&mut b, s2.ptr)?;
        Ok((a, b))
    })()
    .map_err(me)
}
