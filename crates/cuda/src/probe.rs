//! Op-level probes of the matrix kernels for tests and benchmarks: the mat-vec and GEMM paths on given
//! weights, mat-vec timing at given shapes, and the device's streaming read bandwidth.
use crate::dec_attn::DecAttn;
use crate::gpu::{Gpu, Result, A};
use crate::matvec::{cdiv, grouped_direct, launch_moe_gemm, launch_dq, launch_mv, launch_mvq8, launch_mvq8_ks, launch_q80, launch_q8k, mvq_ks, split_layout, DM};
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

/// Op-level check of `mvq8_q8m_r2` (several activation rows through one split Q8_0 matrix, as a
/// verify step's rows): `data` is one `rows` × `cols` Q8_0 matrix, `x` holds `z` activation rows.
/// Returns y (z × rows) from one launch of all rows and from one one-row launch per row, both with the
/// one-row K split (the verify rows' and decode's).
pub fn shared_rows_q8_0_paths(rows: usize, cols: usize, z: usize, data: &[u8], x: &[f32]) -> ds4_model::Result<(Vec<f32>, Vec<f32>)> {
    (|| -> Result<(Vec<f32>, Vec<f32>)> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let ty = GgmlType::Q8_0;
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        if data.len() != row_bytes * rows || x.len() != cols * z {
            return Err("shared_rows_q8_0_paths: bad sizes".into());
        }
        let wb = g.alloc(data.len())?;
        g.htod(wb.ptr, data)?;
        let mut m = DM { ptr: wb.ptr, ty, rows, cols, n_mat: 1, row_bytes, split: false };
        split_layout(&mut g, &mut m)?;
        let xb = g.alloc(x.len() * 4)?;
        g.htod(xb.ptr, x)?;
        let (qb, db) = (g.alloc(x.len())?, g.alloc(x.len() / 32 * 4)?);
        launch_q80(&mut g, xb.ptr, cols, cols, z, qb.ptr, db.ptr)?;
        let ks = mvq_ks(&m, rows, 1);
        let (ya, yb) = (g.alloc(z * rows * 4)?, g.alloc(z * rows * 4)?);
        launch_mvq8_ks(&mut g, &m, wb.ptr, 0, 0, qb.ptr, db.ptr, cols, ya.ptr, rows, rows, z, ks)?;
        for r in 0..z {
            let (q, d, y) = (qb.ptr + (r * cols) as u64, db.ptr + (r * cols / 32 * 4) as u64, yb.ptr + (r * rows * 4) as u64);
            launch_mvq8_ks(&mut g, &m, wb.ptr, 0, 0, q, d, 0, y, 0, rows, 1, ks)?;
        }
        let (mut a, mut b) = (vec![0f32; z * rows], vec![0f32; z * rows]);
        g.dtoh(&mut a, ya.ptr)?;
        g.dtoh(&mut b, yb.ptr)?;
        Ok((a, b))
    })()
    .map_err(me)
}

/// Op-level check of the grouped expert GEMM: `data` holds `counts.len()` expert matrices of `rows`
/// × `cols` (`ty` IQ2_XXS, converted to the split layout as at load, or Q2_K); expert e takes the
/// next `counts[e]` rows of `x` (f32, converted to f16 as in prefill). Returns Y (tokens × rows)
/// from the kernel reading the blocks as stored (tiles of 64 tokens, then of 128) and from
/// dequantize-to-f16 + the f16 kernel.
pub fn grouped_gemm_paths(ty: GgmlType, rows: usize, cols: usize, counts: &[usize], data: &[u8], x: &[f32]) -> ds4_model::Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    (|| -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
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
        let tile_list = |bt: usize| {
            let mut tiles: Vec<[i32; 4]> = Vec::new();
            let mut off = 0usize;
            for (e, &c) in counts.iter().enumerate() {
                for t0 in (0..c).step_by(bt) {
                    tiles.push([e as i32, (off + t0) as i32, (c - t0).min(bt) as i32, 0]);
                }
                off += c;
            }
            tiles
        };
        let (tiles, tiles128) = (tile_list(64), tile_list(128));
        let tb = g.alloc(tiles.len().max(1) * 16)?;
        g.htod(tb.ptr, &tiles)?;
        let tb128 = g.alloc(tiles128.len().max(1) * 16)?;
        g.htod(tb128.ptr, &tiles128)?;
        let wh = g.alloc(ne * rows * cols * 2)?;
        launch_dq(&mut g, &m, wb.ptr, wh.ptr, ne * rows * cols)?;
        let (y1, y2) = (g.alloc(total * rows * 4)?, g.alloc(total * rows * 4)?);
        let grid = (tiles.len() as u32, (rows / 128) as u32, 1);
        launch_moe_gemm(&mut g, name, 64, grid, &[A::P(wb.ptr), A::P(m.mat_bytes() as u64), A::P(tb.ptr), A::P(xh.ptr), A::P(y1.ptr), A::I(cols as i32), A::I(rows as i32), A::I(0)])?;
        launch_moe_gemm(&mut g, "moe_gemm", 64, grid, &[A::P(wh.ptr), A::P((rows * cols * 2) as u64), A::P(tb.ptr), A::P(xh.ptr), A::P(y2.ptr), A::I(cols as i32), A::I(rows as i32), A::I(0)])?;
        let y3 = g.alloc(total * rows * 4)?;
        let grid128 = (tiles128.len() as u32, (rows / 128) as u32, 1);
        launch_moe_gemm(&mut g, name, 128, grid128, &[A::P(wb.ptr), A::P(m.mat_bytes() as u64), A::P(tb128.ptr), A::P(xh.ptr), A::P(y3.ptr), A::I(cols as i32), A::I(rows as i32), A::I(0)])?;
        let (mut a, mut b, mut c) = (vec![0f32; total * rows], vec![0f32; total * rows], vec![0f32; total * rows]);
        g.dtoh(&mut a, y1.ptr)?;
        g.dtoh(&mut b, y2.ptr)?;
        g.dtoh(&mut c, y3.ptr)?;
        Ok((a, b, c))
    })()
    .map_err(me)
}

/// Seconds per int8-activation mat-vec call (one token, `z` slots of `rows` × `cols`; arbitrary
/// weights), timed with CUDA events over `reps` launches; the activation quantization is not timed.
/// `ks` = 0: the engine's K split, else that one. The launches rotate over copies of the weights
/// spanning at least 256 MB, so that (as in decode, where a layer's weights pass through once) no
/// launch finds its matrix in the 50 MB L2.
pub fn bench_matvec_fast(ty: GgmlType, rows: usize, cols: usize, z: usize, reps: usize, ks: usize) -> ds4_model::Result<f64> {
    (|| -> Result<f64> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        let copies = (256usize << 20).div_ceil(row_bytes * rows * z).max(1);
        let (wb, m) = zero_stack(&mut g, ty, rows, cols, z * copies, row_bytes)?;
        let qb = g.alloc_zeroed(cols)?;
        let db = g.alloc_zeroed(cols / 32 * 4)?;
        let yb = g.alloc_zeroed(rows * z * 4)?;
        let eids: Vec<i32> = (0..z as i32).collect();
        let eb = g.alloc(z * 4)?;
        g.htod(eb.ptr, &eids)?;
        let ks = if ks == 0 { mvq_ks(&m, rows, z) } else { ks };
        let mut i = 0usize;
        let mut run = |g: &mut Gpu| {
            let w = wb.ptr + ((i % copies) * z * m.mat_bytes()) as u64;
            i += 1;
            launch_mvq8_ks(g, &m, w, m.mat_bytes(), eb.ptr, qb.ptr, db.ptr, 0, yb.ptr, rows, rows, z, ks)
        };
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


/// The greedy kernel (`argmax_row` over `blocks` blocks) on one row, launched `launches` times on
/// the same buffer (its ticket must reset itself): (index, log-probability) of each launch.
pub fn greedy_row(x: &[f32], blocks: u32, launches: usize) -> ds4_model::Result<Vec<(u32, f32)>> {
    (|| -> Result<Vec<(u32, f32)>> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let xb = upload(&g, x)?;
        let out = g.alloc_zeroed((3 + 3 * blocks as usize) * 4)?;
        let mut r = Vec::new();
        for _ in 0..launches {
            g.launch("argmax_row", (blocks, 1, 1), 256, 0, &[A::P(xb.ptr), A::I(x.len() as i32), A::P(out.ptr)])?;
            g.sync()?;
            let mut top = [0i32; 2];
            g.dtoh(&mut top, out.ptr)?;
            r.push((top[0] as u32, f32::from_bits(top[1] as u32)));
        }
        Ok(r)
    })()
    .map_err(me)
}

/// Large copies through the pinned staging buffers (`staging.rs`) with slices of `slice` bytes: each
/// of `sizes` bytes goes up by the staging path and comes back by the plain copy, and goes up by the
/// plain copy and comes back by the staging path, twice with the same buffers (the second pass reuses
/// buffers whose last DMA may still run). Whether every byte came back as it went, per size.
pub fn staging_round_trips(sizes: &[usize], slice: usize) -> ds4_model::Result<Vec<bool>> {
    (|| -> Result<Vec<bool>> {
        let g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let mut st = crate::staging::HostStaging::new(slice)?;
        let mut ok = Vec::new();
        for pass in 0..2u8 {
            for &n in sizes {
                let src: Vec<u8> = (0..n).map(|i| (i as u32).wrapping_mul(2654435761).rotate_left(pass as u32 * 7) as u8).collect();
                let d = g.alloc(n)?;
                st.htod(&g, d.ptr, &src, |_| {})?;
                let mut back = vec![0u8; n];
                g.dtoh(&mut back, d.ptr)?;
                let up = back == src;
                let d2 = g.alloc(n)?;
                g.htod(d2.ptr, &src)?;
                let mut back2 = vec![0u8; n];
                st.dtoh(&g, &mut back2, d2.ptr)?;
                ok.push(up && back2 == src);
            }
        }
        Ok(ok)
    })()
    .map_err(me)
}

/// Inputs of one prefill attention call for [`attention_paths`] (and, with n = 1 and the raw query, of
/// [`decode_attention_path`]): `n` tokens at positions
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

/// `v` copied to a new device buffer (at least one float, so empty inputs still have an address).
pub(crate) fn upload(g: &Gpu, v: &[f32]) -> Result<crate::gpu::DBuf> {
    let b = g.alloc(v.len().max(1) * 4)?;
    if !v.is_empty() {
        g.htod(b.ptr, v)?;
    }
    Ok(b)
}

/// The device copies of an [`AttnCase`]'s inputs (`sel` holds one int when the case has none).
struct CaseBufs {
    q: crate::gpu::DBuf,
    kvb: crate::gpu::DBuf,
    ring: crate::gpu::DBuf,
    comp: crate::gpu::DBuf,
    sinks: crate::gpu::DBuf,
    fr: crate::gpu::DBuf,
    sel: crate::gpu::DBuf,
}

impl CaseBufs {
    fn upload(g: &Gpu, c: &AttnCase) -> Result<Self> {
        let (q, kvb, ring, comp, sinks) = (upload(g, c.q)?, upload(g, c.kvb)?, upload(g, c.ring)?, upload(g, c.comp)?, upload(g, c.sinks)?);
        let fr = g.alloc(c.freqs.len().max(1) * 8)?;
        g.htod(fr.ptr, c.freqs)?;
        let sel = g.alloc(c.sel.map_or(1, |s| s.len()) * 4)?;
        if let Some(s) = c.sel {
            g.htod(sel.ptr, s)?;
        }
        Ok(Self { q, kvb, ring, comp, sinks, fr, sel })
    }
}

/// Op-level check of prefill attention: the output (n × nh × d, inverse rope applied) of the f32
/// kernel and of the tensor-core kernel with `tc_heads` heads per block (64 or 32).
pub fn attention_paths(c: &AttnCase, tc_heads: usize) -> ds4_model::Result<(Vec<f32>, Vec<f32>)> {
    (|| -> Result<(Vec<f32>, Vec<f32>)> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let CaseBufs { q, kvb, ring, comp, sinks, fr, sel } = CaseBufs::upload(&g, c)?;
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

/// Output of [`decode_attention_path`].
pub struct DecodeAttnOut {
    /// nh × d attention output (inverse rope applied).
    pub o: Vec<f32>,
    /// The ring after the call: this token's row stored at slot pos % swa.
    pub ring: Vec<f32>,
    /// The merge's Q8_0 copy of `o` (values; one scale per 32), empty when d % 32 != 0.
    pub q80: Vec<i8>,
    pub d80: Vec<f32>,
    /// A second call on the same inputs gave bit-identical outputs.
    pub repeat_identical: bool,
}

/// Op-level check of one-token decode attention, launched as the stage launches it (`DecAttn`:
/// attn_dec + attn_dec_merge, with PDL where the device has it): `c.n == 1`; `c.q` is the raw query
/// (the q_b product: the kernel normalises each head with `eps` and ropes it at `c.pos0`, which it
/// reads from device memory as in decode); `c.kvb` is this token's KV row. The partials and the grid
/// are sized for `max_cand` candidates (the context's largest count); partials and output start as
/// NaN, so a chunk the merge reads but nobody wrote shows.
pub fn decode_attention_path(c: &AttnCase, eps: f32, max_cand: usize) -> ds4_model::Result<DecodeAttnOut> {
    (|| -> Result<DecodeAttnOut> {
        if c.n != 1 || c.q.len() != c.nh * c.d || c.kvb.len() != c.d || c.ring.len() != c.swa * c.d {
            return Err("decode_attention_path: bad sizes".into());
        }
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        g.pdl_now = g.pdl;
        let (nh, d) = (c.nh, c.d);
        let CaseBufs { q, kvb, ring, comp, sinks, fr, sel } = CaseBufs::upload(&g, c)?;
        let nsplit = DecAttn::splits(max_cand);
        let part = upload(&g, &vec![f32::NAN; DecAttn::part_floats(nsplit, nh, d)])?;
        let o = upload(&g, &vec![f32::NAN; nh * d])?;
        let with_q80 = d % 32 == 0;
        let (qb, db) = (g.alloc(nh * d)?, g.alloc((nh * d / 32).max(1) * 4)?);
        let dpos = g.alloc(8)?;
        g.htod(dpos.ptr, &[c.pos0 as i64])?;
        let a = DecAttn {
            q: q.ptr,
            kvb: kvb.ptr,
            ring: ring.ptr,
            comp: comp.ptr,
            sel: if c.sel.is_some() { sel.ptr } else { 0 },
            sinks: sinks.ptr,
            freqs: fr.ptr,
            part: part.ptr,
            o: o.ptr,
            q80: if with_q80 { qb.ptr } else { 0 },
            d80: if with_q80 { db.ptr } else { 0 },
            dpos: dpos.ptr,
            pos: c.pos0 as i64,
            nh,
            d,
            half: c.freqs.len(),
            swa: c.swa,
            ratio: c.ratio,
            topk: c.topk,
            nsplit,
            eps,
            rows: 1,
            pstride: 0,
        };
        let run = |g: &mut Gpu| -> Result<(Vec<f32>, Vec<i8>, Vec<f32>)> {
            a.launch(g)?;
            let mut ov = vec![0f32; nh * d];
            g.dtoh(&mut ov, o.ptr)?;
            let (mut qv, mut dv) = (vec![0i8; if with_q80 { nh * d } else { 0 }], vec![0f32; if with_q80 { nh * d / 32 } else { 0 }]);
            if with_q80 {
                g.dtoh(&mut qv, qb.ptr)?;
                g.dtoh(&mut dv, db.ptr)?;
            }
            Ok((ov, qv, dv))
        };
        let (ov, qv, dv) = run(&mut g)?;
        let mut ring_after = vec![0f32; c.ring.len()];
        g.dtoh(&mut ring_after, ring.ptr)?;
        // Again (the ring slot now holds this token's row, outside the window read).
        let (o2, q2, d2) = run(&mut g)?;
        let bits = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits());
        let repeat_identical = bits(&ov, &o2) && qv == q2 && bits(&dv, &d2);
        Ok(DecodeAttnOut { o: ov, ring: ring_after, q80: qv, d80: dv, repeat_identical })
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
        let smem = ((h * (d + 1) + 8 * d) * 4) as u32;
        let args = [A::P(qb.ptr), A::P(wb.ptr), A::P(kb.ptr), A::P(s1.ptr), A::I(ldsc as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(topk as i32), A::I(h as i32), A::I(d as i32), A::P(0)];
        g.launch("idx_scores", (cdiv(ldsc, 8), n as u32, 1), 256, smem, &args)?;
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

/// One check of an int8 activation copy written by a producing kernel: how many int8 values and
/// scales differ from quantizing the kernel's f32 output with `q80_quant` / `q8k_quant`, and for the
/// fused sub-layer entry the f32 output's relative error against the unfused kernels.
#[derive(Debug, Clone)]
pub struct CopyCheck {
    pub what: &'static str,
    pub values: usize,
    pub mismatches: usize,
    pub rel_err: f64,
}

/// Runs the producers that write int8 copies (rms_rows, the SwiGLU for Q8_0 and Q8_K, the fused
/// decode sub-layer entries for both) on random data of the given sizes (`e` embedding, `nh` streams,
/// `ff` expert width, `k` experts), each compared with the stand-alone quantization of its output.
/// The entry with the previous exit folded in (`hc_entry_dec`) is also checked against the exit
/// kernels (streams: `mismatches` counts differing bits) and, for the FFN exit, its folded router
/// against mat-vec + route (`mismatches` counts differing experts).
pub fn act_copy_checks(seed: u64, e: usize, nh: usize, ff: usize, k: usize) -> ds4_model::Result<Vec<CopyCheck>> {
    (|| -> Result<Vec<CopyCheck>> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let mut rng = ds4_quant::random::SplitMix64(seed);
        let mut v = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|_| rng.normal() * s).collect() };
        let up = |g: &Gpu, v: &[f32]| -> Result<crate::gpu::DBuf> {
            let b = g.alloc(v.len() * 4)?;
            g.htod(b.ptr, v)?;
            Ok(b)
        };
        // Reference copies of `n` floats at `x` (Q8_0 or Q8_K), downloaded.
        let quant = |g: &mut Gpu, x: u64, n: usize, k8: bool| -> Result<(Vec<i8>, Vec<f32>)> {
            let per = if k8 { 256 } else { 32 };
            let (qb, db) = (g.alloc(n)?, g.alloc(n / per * 4)?);
            if k8 { launch_q8k(g, x, n, n, 1, qb.ptr, db.ptr)? } else { launch_q80(g, x, n, n, 1, qb.ptr, db.ptr)? };
            let (mut q, mut d) = (vec![0i8; n], vec![0f32; n / per]);
            g.dtoh(&mut q, qb.ptr)?;
            g.dtoh(&mut d, db.ptr)?;
            Ok((q, d))
        };
        let fetch = |g: &mut Gpu, q: u64, d: u64, n: usize, per: usize| -> Result<(Vec<i8>, Vec<f32>)> {
            let (mut qv, mut dv) = (vec![0i8; n], vec![0f32; n / per]);
            g.dtoh(&mut qv, q)?;
            g.dtoh(&mut dv, d)?;
            Ok((qv, dv))
        };
        let diff = |a: &(Vec<i8>, Vec<f32>), b: &(Vec<i8>, Vec<f32>)| -> usize {
            a.0.iter().zip(&b.0).filter(|(x, y)| x != y).count() + a.1.iter().zip(&b.1).filter(|(x, y)| x.to_bits() != y.to_bits()).count()
        };
        let mut out = Vec::new();
        // rms_rows with its Q8_0 copy (1024 threads, as in decode).
        let d = 1024usize;
        let (xb, wb, yb) = (up(&g, &v(d, 1.0))?, up(&g, &v(d, 0.5))?, g.alloc(d * 4)?);
        let (qb, db) = (g.alloc(d)?, g.alloc(d / 32 * 4)?);
        g.launch("rms_rows", (1, 1, 1), 1024, 0, &[A::P(xb.ptr), A::I(d as i32), A::P(yb.ptr), A::I(d as i32), A::I(d as i32), A::P(wb.ptr), A::F(1e-6), A::P(qb.ptr), A::P(db.ptr)])?;
        let got = fetch(&mut g, qb.ptr, db.ptr, d, 32)?;
        let want = quant(&mut g, yb.ptr, d, false)?;
        out.push(CopyCheck { what: "rms_rows Q8_0", values: d, mismatches: diff(&got, &want), rel_err: 0.0 });
        // SwiGLU with Q8_0 (shared expert) and Q8_K (routed experts, per-row weights) copies.
        for k8 in [false, true] {
            let n = if k8 { k * ff } else { ff };
            let (ab, bb, wts) = (up(&g, &v(n, 3.0))?, up(&g, &v(n, 3.0))?, up(&g, &v(k, 1.0))?);
            let (qb, db) = (g.alloc(n)?, g.alloc(n / 32 * 4)?);
            let (q80, d80, q8k, d8k) = if k8 { (0, 0, qb.ptr, db.ptr) } else { (qb.ptr, db.ptr, 0, 0) };
            let w = if k8 { wts.ptr } else { 0 };
            g.launch("swiglu", (cdiv(n, 256), 1, 1), 256, 0, &[A::P(ab.ptr), A::P(bb.ptr), A::P(n as u64), A::I(ff as i32), A::F(10.0), A::P(w), A::P(q80), A::P(d80), A::P(q8k), A::P(d8k)])?;
            let per = if k8 { 256 } else { 32 };
            let got = fetch(&mut g, qb.ptr, db.ptr, n, per)?;
            let want = quant(&mut g, ab.ptr, n, k8)?;
            out.push(CopyCheck { what: if k8 { "swiglu Q8_K" } else { "swiglu Q8_0" }, values: n, mismatches: diff(&got, &want), rel_err: 0.0 });
        }
        // The fused decode sub-layer entry (hc_entry_dec) against the exit kernels, the F16 mat-vec
        // and hc_pre_norm, and its copies.
        let (hd, nm) = (nh * e, (2 + nh) * nh);
        let wf: Vec<u16> = v(nm * hd, 0.02).iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
        let wdev = g.alloc(wf.len() * 2)?;
        g.htod(wdev.ptr, &wf)?;
        let (sc, base, nw) = (up(&g, &v(3, 0.5))?, up(&g, &v(nm, 0.5))?, up(&g, &v(e, 1.0))?);
        let (mix, xn1, xn2) = (g.alloc(nm * 4)?, g.alloc(e * 4)?, g.alloc(e * 4)?);
        let m = DM { ptr: wdev.ptr, ty: GgmlType::F16, rows: nm, cols: hd, n_mat: 1, row_bytes: hd * 2, split: false };
        let (q0, d0, qk, dk) = (g.alloc(e)?, g.alloc(e / 32 * 4)?, g.alloc(e)?, g.alloc(e / 256 * 4)?);
        let mix2 = g.alloc(nm * 4)?;
        // The entry with the previous exit folded in (hc_entry_dec) against the exit kernel, then
        // the mat-vec + hc_pre_norm: no exit, the attention exit, the FFN exit (k rows + shared).
        let rel = |a: &[f32], b: &[f32]| -> f64 {
            let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
            (num / den.max(1e-30)).sqrt()
        };
        let x0 = v(hd, 1.0);
        let mixes0 = [v(nh, 1.0), v(nh * nh, 0.5)].concat();
        let (ey, eadd) = (v(k * e, 1.0), v(e, 1.0));
        let (eyb, addb) = (up(&g, &ey)?, up(&g, &eadd)?);
        let part2 = g.alloc(crate::stage::hc_entry_part_floats(e, nm) * 4)?;
        let bar = g.alloc_zeroed(8)?;
        // The FFN's router (gate_route_dec) on the entry's xn: 256 experts, 6 chosen, a selection bias.
        let (ne, kr) = (256usize, 6usize);
        let gwf: Vec<u16> = v(ne * e, 0.02).iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
        let gw = g.alloc(gwf.len() * 2)?;
        g.htod(gw.ptr, &gwf)?;
        let gm = DM { ptr: gw.ptr, ty: GgmlType::F16, rows: ne, cols: e, n_mat: 1, row_bytes: e * 2, split: false };
        let (bias, toks) = (up(&g, &v(ne, 0.05))?, g.alloc_zeroed(4)?);
        let (rlog, glog, gticket) = (g.alloc(ne * 4)?, g.alloc(ne * 4)?, g.alloc_zeroed(4)?);
        let (eid1, ew1, eid2, ew2) = (g.alloc(kr * 4)?, g.alloc(kr * 4)?, g.alloc(kr * 4)?, g.alloc(kr * 4)?);
        for xmode in 0..3 {
            // Reference: exit kernel on one copy of the streams, then the unfused entry.
            let (xr, mr) = (up(&g, &x0)?, up(&g, &mixes0)?);
            match xmode {
                1 => g.launch("hc_post", (cdiv(e, 256), 1, 1), 256, 0, &[A::P(mr.ptr), A::I(nh as i32), A::P(eyb.ptr), A::P(xr.ptr), A::I(e as i32)])?,
                2 => g.launch("moe_combine_post", (cdiv(e, 256), 1, 1), 256, 0, &[A::P(eyb.ptr), A::P(0), A::I(k as i32), A::P(addb.ptr), A::P(mr.ptr), A::I(nh as i32), A::P(xr.ptr), A::I(e as i32)])?,
                _ => {}
            }
            launch_mv(&mut g, &m, m.ptr, 0, 0, xr.ptr, hd, 0, mix.ptr, nm, 0, nm, 1, 1)?;
            let args = [A::P(mix.ptr), A::P(sc.ptr), A::P(base.ptr), A::I(nh as i32), A::I(20), A::F(1e-6), A::P(xr.ptr), A::I(e as i32), A::P(mr.ptr), A::P(nw.ptr), A::F(1e-6), A::P(xn1.ptr), A::I(0)];
            g.launch("hc_pre_norm", (1, 1, 1), 1024, (e * 4) as u32, &args)?;
            let routed = xmode == 2;
            if routed {
                launch_mv(&mut g, &gm, gm.ptr, 0, 0, xn1.ptr, e, 0, rlog.ptr, ne, 0, ne, 1, 1)?;
                let ra = [A::P(rlog.ptr), A::I(ne as i32), A::P(bias.ptr), A::P(0), A::P(toks.ptr), A::I(kr as i32), A::I(1), A::F(1.5), A::P(eid1.ptr), A::P(ew1.ptr)];
                g.launch("route", (1, 1, 1), 256, 0, &ra)?;
            }
            // Fused, twice from the same input (the barrier must be reusable: graph replay).
            let (xf, mf) = (up(&g, &x0)?, up(&g, &mixes0)?);
            for _ in 0..2 {
                g.htod(xf.ptr, &x0)?;
                g.htod(mf.ptr, &mixes0)?;
                let (ey_p, ek, add_p) = match xmode {
                    1 => (eyb.ptr, 0, 0),
                    2 => (eyb.ptr, k, addb.ptr),
                    _ => (0, 0, 0),
                };
                let args = [
                    A::P(wdev.ptr), A::I(nm as i32), A::P(xf.ptr), A::I(e as i32), A::I(nh as i32), A::P(part2.ptr), A::P(bar.ptr), A::P(sc.ptr), A::P(base.ptr),
                    A::F(1e-6), A::P(mix2.ptr), A::P(mf.ptr), A::P(nw.ptr), A::F(1e-6), A::P(xn2.ptr), A::P(q0.ptr), A::P(d0.ptr), A::P(qk.ptr), A::P(dk.ptr),
                    A::I(xmode), A::P(ey_p), A::I(ek as i32), A::P(add_p),
                ];
                g.launch("hc_entry_dec", ((e / 256) as u32, 1, 1), 256, 0, &args)?;
            }
            if routed {
                let ra = [A::P(gw.ptr), A::P(xn2.ptr), A::I(e as i32), A::P(glog.ptr), A::P(gticket.ptr), A::I(ne as i32), A::P(bias.ptr), A::P(0), A::P(toks.ptr), A::I(kr as i32), A::I(1), A::F(1.5), A::P(eid2.ptr), A::P(ew2.ptr)];
                g.launch("gate_route_dec", ((ne / 4) as u32, 1, 1), 256, 0, &ra)?;
            }
            let (mut sa, mut sb) = (vec![0f32; hd], vec![0f32; hd]);
            g.dtoh(&mut sa, xr.ptr)?;
            g.dtoh(&mut sb, xf.ptr)?;
            let streams_differ = sa.iter().zip(&sb).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            let (mut pa, mut pb) = (vec![0f32; nh], vec![0f32; nh]);
            g.dtoh(&mut pa, mr.ptr)?;
            g.dtoh(&mut pb, mf.ptr)?;
            let (mut a, mut b) = (vec![0f32; e], vec![0f32; e]);
            g.dtoh(&mut a, xn1.ptr)?;
            g.dtoh(&mut b, xn2.ptr)?;
            let err = rel(&a, &b).max(rel(&pa, &pb));
            let name = ["hc_entry_dec (no exit)", "hc_entry_dec (attention exit)", "hc_entry_dec (FFN exit)"][xmode as usize];
            out.push(CopyCheck { what: name, values: hd, mismatches: streams_differ, rel_err: err });
            let got = fetch(&mut g, q0.ptr, d0.ptr, e, 32)?;
            let want = quant(&mut g, xn2.ptr, e, false)?;
            let got_k = fetch(&mut g, qk.ptr, dk.ptr, e, 256)?;
            let want_k = quant(&mut g, xn2.ptr, e, true)?;
            out.push(CopyCheck { what: "hc_entry_dec Q8_0 + Q8_K copies", values: 2 * e, mismatches: diff(&got, &want) + diff(&got_k, &want_k), rel_err: err });
            if routed {
                let (mut ia, mut ib, mut wa, mut wb) = (vec![0i32; kr], vec![0i32; kr], vec![0f32; kr], vec![0f32; kr]);
                g.dtoh(&mut ia, eid1.ptr)?;
                g.dtoh(&mut ib, eid2.ptr)?;
                g.dtoh(&mut wa, ew1.ptr)?;
                g.dtoh(&mut wb, ew2.ptr)?;
                let other = ia.iter().zip(&ib).filter(|(a, b)| a != b).count();
                out.push(CopyCheck { what: "gate_route_dec on hc_entry_dec's xn (experts differing; weights)", values: kr, mismatches: other, rel_err: rel(&wa, &wb) });
            }
        }
        Ok(out)
    })()
    .map_err(me)
}

/// The fused decode router (`gate_route_dec`) against the F16 mat-vec + `route` on random data (`e`
/// columns, `ne` experts, `k` chosen, with a selection bias): whether the chosen experts are the same,
/// the largest relative difference of their weights, the gate logits' relative error, and whether a
/// launch of 3 grid rows (3 tokens) routes each row bit for bit as a one-row launch does.
pub fn router_check(seed: u64, e: usize, ne: usize, k: usize) -> ds4_model::Result<(bool, f64, f64, bool)> {
    (|| -> Result<(bool, f64, f64, bool)> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let mut rng = ds4_quant::random::SplitMix64(seed);
        let mut v = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|_| rng.normal() * s).collect() };
        let wf: Vec<u16> = v(ne * e, 0.05).iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
        let wdev = g.alloc(wf.len() * 2)?;
        g.htod(wdev.ptr, &wf)?;
        let (xv, bv) = (v(e, 1.0), v(ne, 0.1));
        let (x, bias) = (g.alloc(e * 4)?, g.alloc(ne * 4)?);
        g.htod(x.ptr, &xv)?;
        g.htod(bias.ptr, &bv)?;
        let (l1, l2, ids1, ids2, w1, w2) = (g.alloc(ne * 4)?, g.alloc(ne * 4)?, g.alloc(k * 4)?, g.alloc(k * 4)?, g.alloc(k * 4)?, g.alloc(k * 4)?);
        let ticket = g.alloc_zeroed(4)?;
        let m = DM { ptr: wdev.ptr, ty: GgmlType::F16, rows: ne, cols: e, n_mat: 1, row_bytes: e * 2, split: false };
        launch_mv(&mut g, &m, m.ptr, 0, 0, x.ptr, e, 0, l1.ptr, ne, 0, ne, 1, 1)?;
        let bs = ne.next_power_of_two().clamp(32, 1024) as u32;
        let rargs = |l: u64, ids: u64, w: u64| [A::P(l), A::I(ne as i32), A::P(bias.ptr), A::P(0), A::P(0), A::I(k as i32), A::I(1), A::F(1.5), A::P(ids), A::P(w)];
        g.launch("route", (1, 1, 1), bs, 0, &rargs(l1.ptr, ids1.ptr, w1.ptr))?;
        let fargs = [A::P(wdev.ptr), A::P(x.ptr), A::I(e as i32), A::P(l2.ptr), A::P(ticket.ptr), A::I(ne as i32), A::P(bias.ptr), A::P(0), A::P(0), A::I(k as i32), A::I(1), A::F(1.5), A::P(ids2.ptr), A::P(w2.ptr)];
        // Twice: the ticket must be back at zero for the next launch.
        for _ in 0..2 {
            g.launch("gate_route_dec", ((ne / 4) as u32, 1, 1), 256, 0, &fargs)?;
        }
        let (mut a, mut b) = (vec![0f32; ne], vec![0f32; ne]);
        g.dtoh(&mut a, l1.ptr)?;
        g.dtoh(&mut b, l2.ptr)?;
        let (mut i1, mut i2) = (vec![0i32; k], vec![0i32; k]);
        g.dtoh(&mut i1, ids1.ptr)?;
        g.dtoh(&mut i2, ids2.ptr)?;
        let (mut e1, mut e2) = (vec![0f32; k], vec![0f32; k]);
        g.dtoh(&mut e1, w1.ptr)?;
        g.dtoh(&mut e2, w2.ptr)?;
        let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
        let wd = e1.iter().zip(&e2).map(|(x, y)| ((x - y).abs() / x.abs().max(1e-30)) as f64).fold(0.0, |m, v| if v.is_nan() { f64::INFINITY } else { m.max(v) });
        // Three rows in one launch (tickets 4 ints apart), each against its own one-row launch.
        let rows = 3usize;
        let xr = v(rows * e, 1.0);
        let (xs, ls, is, ws, tk) = (g.alloc(rows * e * 4)?, g.alloc(rows * ne * 4)?, g.alloc(rows * k * 4)?, g.alloc(rows * k * 4)?, g.alloc_zeroed(rows * 16)?);
        g.htod(xs.ptr, &xr)?;
        let rargs3 = |x: u64, l: u64, ids: u64, w: u64| [A::P(wdev.ptr), A::P(x), A::I(e as i32), A::P(l), A::P(tk.ptr), A::I(ne as i32), A::P(bias.ptr), A::P(0), A::P(0), A::I(k as i32), A::I(1), A::F(1.5), A::P(ids), A::P(w)];
        g.launch("gate_route_dec", ((ne / 4) as u32, rows as u32, 1), 256, 0, &rargs3(xs.ptr, ls.ptr, is.ptr, ws.ptr))?;
        let (mut ia, mut wa) = (vec![0i32; rows * k], vec![0f32; rows * k]);
        g.dtoh(&mut ia, is.ptr)?;
        g.dtoh(&mut wa, ws.ptr)?;
        let mut rows_same = true;
        for r in 0..rows {
            let xo = (r * e * 4) as u64;
            g.launch("gate_route_dec", ((ne / 4) as u32, 1, 1), 256, 0, &rargs3(xs.ptr + xo, l2.ptr, ids2.ptr, w2.ptr))?;
            let (mut ib, mut wb) = (vec![0i32; k], vec![0f32; k]);
            g.dtoh(&mut ib, ids2.ptr)?;
            g.dtoh(&mut wb, w2.ptr)?;
            rows_same &= ia[r * k..(r + 1) * k] == ib[..] && wa[r * k..(r + 1) * k].iter().zip(&wb).all(|(a, b)| a.to_bits() == b.to_bits());
        }
        Ok((i1 == i2, wd, (num / den.max(1e-30)).sqrt(), rows_same))
    })()
    .map_err(me)
}
