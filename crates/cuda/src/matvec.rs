//! Matrix kernels: the device matrix descriptor, the choice of mat-vec / dequantization kernel for a
//! weight type and layout, their launch geometry, and the split row layout written at load.
use crate::gpu::{Gpu, Result, A};
use ds4_gguf::GgmlType;

#[derive(Clone, Copy)]
pub(crate) struct DM {
    pub(crate) ptr: u64,
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) n_mat: usize,
    pub(crate) row_bytes: usize,
    /// Rows converted to the split layout (block payloads, then scales) by `split_rows` at load.
    pub(crate) split: bool,
}

impl DM {
    pub(crate) fn mat_bytes(&self) -> usize { self.rows * self.row_bytes }
}

pub(crate) fn mv_name(t: GgmlType, nt4: bool) -> Result<&'static str> {
    Ok(match (t, nt4) {
        (GgmlType::Q8_0, false) => "mv_q8_0_n1",
        (GgmlType::Q8_0, true) => "mv_q8_0_n4",
        (GgmlType::Q2_K, false) => "mv_q2_k_n1",
        (GgmlType::Q2_K, true) => "mv_q2_k_n4",
        (GgmlType::Q4_K, false) => "mv_q4_k_n1",
        (GgmlType::Q4_K, true) => "mv_q4_k_n4",
        (GgmlType::IQ2_XXS, false) => "mv_iq2_xxs_n1",
        (GgmlType::IQ2_XXS, true) => "mv_iq2_xxs_n4",
        (GgmlType::F16, false) => "mv_f16_n1",
        (GgmlType::F16, true) => "mv_f16_n4",
        (GgmlType::BF16, false) => "mv_bf16_n1",
        (GgmlType::BF16, true) => "mv_bf16_n4",
        (GgmlType::F32, false) => "mv_f32_n1",
        (GgmlType::F32, true) => "mv_f32_n4",
        (t, _) => return Err(format!("no CUDA mat-vec for {}", t.name())),
    })
}

pub(crate) fn dq_name(t: GgmlType) -> Result<&'static str> {
    Ok(match t {
        GgmlType::Q8_0 => "dq_q8_0",
        GgmlType::Q2_K => "dq_q2_k",
        GgmlType::Q4_K => "dq_q4_k",
        GgmlType::IQ2_XXS => "dq_iq2_xxs",
        GgmlType::BF16 => "dq_bf16",
        GgmlType::F32 => "dq_f32",
        t => return Err(format!("no CUDA dequantization for {}", t.name())),
    })
}

/// Warps per output row of the mat-vec kernel: split K when there are too few rows to fill the GPU.
pub(crate) fn ks(total_rows: usize) -> usize {
    if total_rows < 4096 { 8 } else if total_rows < 16384 { 2 } else { 1 }
}

/// Elements one thread of a dequantization kernel writes.
pub(crate) fn dq_unit(t: GgmlType) -> usize {
    if matches!(t, GgmlType::Q2_K | GgmlType::IQ2_XXS) { 8 } else { 32 }
}

pub(crate) fn cdiv(a: usize, b: usize) -> u32 { a.div_ceil(b) as u32 }

/// Row-tiled mat-vec kernel ("mv4", matvec_tiled.cuh) for `m` taking `nt` (1, 4 or 8) tokens per
/// pass, when its type and layout have one.
pub(crate) fn mv4_name(m: &DM, nt: usize) -> Option<&'static str> {
    let base = match m.ty {
        GgmlType::F16 if m.cols % 4 == 0 => 0,
        GgmlType::Q8_0 if m.split => 1,
        GgmlType::Q2_K => 2,
        GgmlType::Q4_K => 3,
        GgmlType::IQ2_XXS if m.split => 4,
        _ => return None,
    };
    const N: [[&str; 3]; 5] = [
        ["mv4_f16_n1", "mv4_f16_n4", "mv4_f16_n8"],
        ["mv4_q8s_n1", "mv4_q8s_n4", "mv4_q8s_n8"],
        ["mv4_q2_k_n1", "mv4_q2_k_n4", "mv4_q2_k_n8"],
        ["mv4_q4_k_n1", "mv4_q4_k_n4", "mv4_q4_k_n8"],
        ["mv4_iq2s_n1", "mv4_iq2s_n4", "mv4_iq2s_n8"],
    ];
    let i = match nt {
        1 => 0,
        4 => 1,
        8 => 2,
        _ => return None,
    };
    Some(N[base][i])
}

/// Warps sharing one 4-row group of the mv4 kernel: split K until about 4096 warps are busy.
pub(crate) fn ks4(rows: usize, cols: usize, z: usize) -> usize {
    let groups = rows.div_ceil(4) * z;
    let chunks = cols.div_ceil(256);
    let mut ks = 1;
    while ks < 8 && groups * ks < 4096 && ks * 2 <= chunks {
        ks *= 2;
    }
    ks
}

/// y = x·Wᵀ over `n` tokens for `z` matrix slots (MV_ARGS in matvec.cuh).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_mv(g: &mut Gpu, m: &DM, w: u64, w_mat_bytes: usize, eids: u64, x: u64, ldx: usize, x_z: usize, y: u64, ldy: usize, y_z: usize, rows: usize, n: usize, z: usize) -> Result<()> {
    launch_mv_split(g, m, w, w_mat_bytes, eids, x, ldx, x_z, y, ldy, y_z, rows, n, z, z)
}

/// [`launch_mv`] with the K split chosen as for `ks_z` slots: a slot's sums depend on the split
/// only, so `z` slots launched with the split of `ks_z` give each slot the rows a launch of `ks_z`
/// slots gives (a verify step's rows, each its decode step's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_mv_split(g: &mut Gpu, m: &DM, w: u64, w_mat_bytes: usize, eids: u64, x: u64, ldx: usize, x_z: usize, y: u64, ldy: usize, y_z: usize, rows: usize, n: usize, z: usize, ks_z: usize) -> Result<()> {
    let nt4 = n > 1;
    // Eight tokens a pass (weights read once) for 5..8 tokens where a tiled kernel exists.
    let nt = if !nt4 { 1 } else if n > 4 && mv4_name(m, 8).is_some() { 8 } else { 4 };
    if n == 1 && ((m.ty == GgmlType::IQ2_XXS && m.split && m.cols % 1024 == 0 && m.cols <= 32768) || (m.ty == GgmlType::Q2_K && m.cols % 512 == 0)) {
        return launch_mvq(g, m, w, w_mat_bytes, eids, x, x_z, y, y_z, rows, z, ks_z);
    }
    let (name, ks, rows_per_block) = match mv4_name(m, nt) {
        Some(name) => {
            let ks = ks4(rows, m.cols, ks_z);
            (name, ks, 4 * (8 / ks))
        }
        None => {
            if m.split {
                return Err(format!("no mat-vec kernel for split-layout {}", m.ty.name()));
            }
            let ks = ks(rows * ks_z);
            (mv_name(m.ty, nt4)?, ks, 8 / ks)
        }
    };
    let args = [
        A::P(w),
        A::P(w_mat_bytes as u64),
        A::P(eids),
        A::P(x),
        A::I(ldx as i32),
        A::I(x_z as i32),
        A::P(y),
        A::I(ldy as i32),
        A::I(y_z as i32),
        A::I(rows as i32),
        A::I(m.cols as i32),
        A::I(n as i32),
        A::I(ks as i32),
    ];
    g.launch(name, (cdiv(rows, rows_per_block), cdiv(n, nt), z as u32), 256, 0, &args)
}

/// One-token IQ2_XXS / Q2_K mat-vec through `mvq_*_n1` (8 rows per warp; IQ2 activations in shared memory).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_mvq(g: &mut Gpu, m: &DM, w: u64, w_mat_bytes: usize, eids: u64, x: u64, x_z: usize, y: u64, y_z: usize, rows: usize, z: usize, ks_z: usize) -> Result<()> {
    let iq2 = m.ty == GgmlType::IQ2_XXS;
    let ks = mvq_ks(m, rows, ks_z);
    let args = [
        A::P(w),
        A::P(w_mat_bytes as u64),
        A::P(eids),
        A::P(x),
        A::I(m.cols as i32),
        A::I(x_z as i32),
        A::P(y),
        A::I(rows as i32),
        A::I(y_z as i32),
        A::I(rows as i32),
        A::I(m.cols as i32),
        A::I(1),
        A::I(ks as i32),
    ];
    let (name, smem) = if iq2 { ("mvq_iq2s_n1", (m.cols * 4) as u32) } else { ("mvq_q2_k_n1", 0) };
    g.launch(name, (cdiv(rows, MVQ_R * (8 / ks)), 1, z as u32), 256, smem, &args)
}

/// Rows per warp of the `mvq*` kernels.
const MVQ_R: usize = 8;

/// Warps sharing a row group of an `mvq*` kernel: split K until about [`MVQ_WARPS`] warps are busy.
pub(crate) fn mvq_ks(m: &DM, rows: usize, z: usize) -> usize {
    // Steps per row: IQ2 lanes take 32-value groups (1024 values a step), Q2_K 2 superblocks a step.
    let steps = match m.ty {
        GgmlType::IQ2_XXS => (m.cols / 256 * 8).div_ceil(32),
        GgmlType::Q8_0 => (m.cols / 32).div_ceil(32),
        _ => (m.cols / 256).div_ceil(2),
    };
    let warps = rows.div_ceil(MVQ_R) * z;
    let target = MVQ_WARPS;
    let mut ks = 1;
    while ks < 8 && warps * ks < target && ks * 2 <= steps {
        ks *= 2;
    }
    ks
}

/// Warps an `mvq*` launch aims for when choosing its K split: flash:6 decode 631-642 t/s at 2048
/// against 614.6 at 1024, 593-625 at 4096 and 638.4 at 3072 in the same runs
/// (bench/results/cuda/ab_flash6.log). More warps than fit at once run in waves, each paying the
/// load latency again.
const MVQ_WARPS: usize = 2048;

/// Whether `m` has a one-token kernel with int8 (Q8_K) activations (`mvq8_*`). Split IQ2_XXS rows
/// must start 8-byte aligned (the kernel loads a group's 8 bytes at once): a multiple of 4 blocks.
/// The kernels address a row by its 32-bit byte offset in the matrix: at most 4 GiB a matrix.
pub(crate) fn q8_ok(m: &DM) -> bool {
    let shape = (m.ty == GgmlType::IQ2_XXS && m.split && m.cols % 1024 == 0) || (m.ty == GgmlType::Q2_K && m.cols % 256 == 0);
    shape && m.rows * m.row_bytes <= u32::MAX as usize
}

/// Whether `m` has a one-token kernel with Q8_0 activations (`mvq8_q8s_n1`): split rows whose
/// payloads start 16-byte aligned (a multiple of 8 blocks).
pub(crate) fn q80_ok(m: &DM) -> bool { m.ty == GgmlType::Q8_0 && m.split && m.cols % 256 == 0 }

/// Q8_0 copy of `z` rows of `cols` floats (row stride `x_z`): int8 values to `q` (row stride `cols`),
/// one scale per 32 values to `d` (the f16 the CPU's quantize_row_q8_0 stores, as f32).
pub(crate) fn launch_q80(g: &mut Gpu, x: u64, x_z: usize, cols: usize, z: usize, q: u64, d: u64) -> Result<()> {
    if cols % 256 != 0 {
        return Err(format!("Q8_0 activations need a multiple of 256 columns, got {cols}"));
    }
    g.launch("q80_quant", ((cols / 256) as u32, z as u32, 1), 256, 0, &[A::P(x), A::I(x_z as i32), A::I(cols as i32), A::P(q), A::P(d)])
}

/// Q8_K copy of `z` rows of `cols` floats (row stride `x_z`): int8 values to `q` (row stride `cols`),
/// one f32 scale per 256 values to `d` (as the CPU's quantize_row_q8_k).
pub(crate) fn launch_q8k(g: &mut Gpu, x: u64, x_z: usize, cols: usize, z: usize, q: u64, d: u64) -> Result<()> {
    if cols % 256 != 0 {
        return Err(format!("Q8_K activations need a multiple of 256 columns, got {cols}"));
    }
    g.launch("q8k_quant", ((cols / 256) as u32, z as u32, 1), 256, 0, &[A::P(x), A::I(x_z as i32), A::I(cols as i32), A::P(q), A::P(d)])
}

/// One-token mat-vec of `z` slots with int8 activations: Q8_K ones from [`launch_q8k`] for Q2_K /
/// IQ2_XXS, Q8_0 ones from [`launch_q80`] for split Q8_0 (`xq_z` = 0 when every slot reads the same
/// row, else `m.cols`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_mvq8(g: &mut Gpu, m: &DM, w: u64, w_mat_bytes: usize, eids: u64, xq: u64, xd: u64, xq_z: usize, y: u64, y_z: usize, rows: usize, z: usize) -> Result<()> {
    launch_mvq8_ks(g, m, w, w_mat_bytes, eids, xq, xd, xq_z, y, y_z, rows, z, mvq_ks(m, rows, z))
}

/// [`launch_mvq8`] with `ks` warps sharing each row group (1, 2, 4 or 8).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_mvq8_ks(g: &mut Gpu, m: &DM, w: u64, w_mat_bytes: usize, eids: u64, xq: u64, xd: u64, xq_z: usize, y: u64, y_z: usize, rows: usize, z: usize, ks: usize) -> Result<()> {
    launch_mvq8_shared(g, m, w, w_mat_bytes, eids, xq, xd, xq_z, 1, y, y_z, rows, z, ks)
}

/// [`launch_mvq8_ks`] where `xdiv` consecutive slots read one activation row (slot z reads row
/// z / xdiv: a batch's rows, each with its k routed experts). Q2_K and IQ2_XXS, or `xdiv` 1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_mvq8_shared(g: &mut Gpu, m: &DM, w: u64, w_mat_bytes: usize, eids: u64, xq: u64, xd: u64, xq_z: usize, xdiv: usize, y: u64, y_z: usize, rows: usize, z: usize, ks: usize) -> Result<()> {
    if ![1, 2, 4, 8].contains(&ks) {
        return Err(format!("K split {ks} is not 1, 2, 4 or 8"));
    }
    // Rows of their own through one matrix (a verify step's rows, a batch's sessions): each step's
    // weights loaded once for all of them, every row's sums as its one-row product's. From 3 rows: at 2
    // the slot-major kernel reading the second row's weights from L2 was as fast (H100 flash:30 verify
    // steps of 2 / 3 / 5 tokens: 1.280 / 1.659 / 2.296 decode steps without it, 1.305 / 1.630 / 2.202 with it).
    if m.ty == GgmlType::Q8_0 && q80_ok(m) && eids == 0 && w_mat_bytes == 0 && xdiv == 1 && xq_z == m.cols && (3..=Q8M_Z).contains(&z) {
        return launch_q8m(g, m, w, xq, xd, y, y_z, rows, z, ks);
    }
    // The IQ2_XXS / Q2_K kernels address a row by its 32-bit byte offset in the matrix.
    if m.ty != GgmlType::Q8_0 && rows * m.row_bytes > u32::MAX as usize {
        return Err(format!("int8-activation mat-vec: {rows} rows of {} bytes exceed 4 GiB", m.row_bytes));
    }
    let mut ks = ks;
    let mut smem = 0;
    let name = match m.ty {
        GgmlType::IQ2_XXS if q8_ok(m) => {
            // Sign-doubled grid (32 KB) and sign-mask table (16 KB): MVQ8_IQ2_SMEM in matvec_q8.cu.
            smem = 48 * 1024;
            "mvq8_iq2s_n1"
        }
        GgmlType::Q2_K if q8_ok(m) => {
            // A step covers 4 superblocks of a row: no more warps per row group than steps.
            let steps = (m.cols / 256).div_ceil(4);
            while ks > 1 && ks > steps {
                ks /= 2;
            }
            "mvq8_q2_k_n1"
        }
        // (The Q8_0 kernels' slots read their own rows: the spread kernel keeps no division in its loop.)
        GgmlType::Q8_0 if xdiv != 1 => return Err("Q8_0 int8-activation mat-vec with shared activation rows".into()),
        GgmlType::Q8_0 if q80_ok(m) && q8p_geometry(g, rows, z, ks).2 <= 8 => "mvq8_q8p",
        GgmlType::Q8_0 if q80_ok(m) => "mvq8_q8s_n1",
        _ => return Err(format!("no int8-activation mat-vec for {} ({} columns, split {})", m.ty.name(), m.cols, m.split)),
    };
    let args = [
        A::P(w),
        A::P(w_mat_bytes as u64),
        A::P(eids),
        A::P(xq),
        A::P(xd),
        A::I(xq_z as i32),
        A::P(y),
        A::I(y_z as i32),
        A::I(rows as i32),
        A::I(m.cols as i32),
        A::I(ks as i32),
        A::I(z as i32),
    ];
    if name == "mvq8_q8p" {
        return launch_q8p(g, &args, rows, z, ks);
    }
    if xdiv == 0 {
        return Err("int8-activation mat-vec: zero slots per activation row".into());
    }
    // (The last argument, z, is read by the mvq8_q8p kernels only; the others take xdiv.) Slots fastest: the slots of a row
    // group run together (slots sharing a matrix read it once from DRAM).
    let groups = cdiv(rows, MVQ_R * (8 / ks));
    if groups > 65535 || z > u32::MAX as usize {
        return Err(format!("int8-activation mat-vec of {rows} rows: {groups} row groups exceed the grid"));
    }
    let mut one = [A::I(0); 12];
    one[..11].copy_from_slice(&args[..11]);
    one[11] = A::I(xdiv as i32);
    g.launch(name, (z as u32, groups, 1), 256, smem, &one)
}

/// Geometry of `mvq8_q8p_r*` (matvec_q80.cu): rows per warp R, blocks, tasks per block. A task is
/// one block of `mvq8_q8s_n1` at R rows per warp; at most 2 blocks per SM walk them, each as many
/// (the last may have fewer), so no round has a few blocks working alone. R is 4 unless the rows are
/// too few for about [`MVQ_WARPS`] busy warps, then 2 or 1, so small matrices still reach every SM.
fn q8p_geometry(g: &Gpu, rows: usize, z: usize, ks: usize) -> (usize, usize, usize) {
    let r = [4, 2].into_iter().find(|&r| rows.div_ceil(r) * z * ks >= MVQ_WARPS).unwrap_or(1);
    let tasks = rows.div_ceil(r * (8 / ks)) * z;
    let per = tasks.div_ceil(if g.sms > 0 { 2 * g.sms as usize } else { tasks });
    (r, tasks.div_ceil(per), per)
}

/// [`launch_mvq8_ks`] for split Q8_0 through `mvq8_q8p_r*`: the same sums as `mvq8_q8s_n1` for the
/// same `ks`. Taken while a block has at most 8 tasks: beyond that (the output head) the hardware's
/// scheduling of `mvq8_q8s_n1`'s many blocks balances the end better (H200: 130.0 against 131.7 us).
fn launch_q8p(g: &mut Gpu, args: &[A; 12], rows: usize, z: usize, ks: usize) -> Result<()> {
    let (r, blocks, _) = q8p_geometry(g, rows, z, ks);
    let name = match r {
        4 => "mvq8_q8p_r4",
        2 => "mvq8_q8p_r2",
        _ => "mvq8_q8p_r1",
    };
    g.launch(name, (blocks as u32, 1, 1), 256, 0, args)
}

/// Most activation rows `mvq8_q8m_r2` takes (Q8M_Z in matvec_q80.cuh).
const Q8M_Z: usize = 8;

/// `z` rows of activations (row stride `m.cols`) through one split Q8_0 matrix by `mvq8_q8m_r2`: two
/// rows a warp, (8 / ks) warps' row groups a task, at most two blocks an SM walking the tasks.
#[allow(clippy::too_many_arguments)]
fn launch_q8m(g: &mut Gpu, m: &DM, w: u64, xq: u64, xd: u64, y: u64, y_z: usize, rows: usize, z: usize, ks: usize) -> Result<()> {
    let tasks = rows.div_ceil(2 * (8 / ks));
    let blocks = if g.sms > 0 { tasks.min(2 * g.sms as usize) } else { tasks };
    let args = [A::P(w), A::P(xq), A::P(xd), A::I(m.cols as i32), A::P(y), A::I(y_z as i32), A::I(rows as i32), A::I(m.cols as i32), A::I(ks as i32), A::I(z as i32)];
    g.launch("mvq8_q8m_r2", (blocks as u32, 1, 1), 256, 0, &args)
}

/// f16 copy of `elems` elements of `m` starting at `src` (whole rows).
pub(crate) fn launch_dq(g: &mut Gpu, m: &DM, src: u64, dst: u64, elems: usize) -> Result<()> {
    if m.split {
        let (name, unit) = match m.ty {
            GgmlType::Q8_0 => ("dq_q8s", 8),
            GgmlType::IQ2_XXS => ("dq_iq2s", 8),
            t => return Err(format!("no split-layout dequantization for {}", t.name())),
        };
        return g.launch(name, (cdiv(elems / unit, 256), 1, 1), 256, 0, &[A::P(src), A::P(dst), A::P(elems as u64), A::I(m.cols as i32)]);
    }
    let name = dq_name(m.ty)?;
    g.launch(name, (cdiv(elems / dq_unit(m.ty), 256), 1, 1), 256, 0, &[A::P(src), A::P(dst), A::P(elems as u64)])
}

/// Block bytes and elements of the types with a split row layout.
fn split_unit(ty: GgmlType) -> Option<(usize, usize)> {
    match ty {
        GgmlType::Q8_0 => Some((34, 32)),
        GgmlType::IQ2_XXS => Some((66, 256)),
        _ => None,
    }
}

/// Whether `split_layout` converts `m` (at load, for weights resident on the device).
pub(crate) fn splits(m: &DM) -> bool { split_unit(m.ty).is_some_and(|(_, unit)| !m.split && (m.cols / unit) % 2 == 0 && m.row_bytes <= 48 * 1024) }

/// Converts a Q8_0 / IQ2_XXS matrix (stack) in place to the split row layout the mv4 kernels read.
pub(crate) fn split_layout(g: &mut Gpu, m: &mut DM) -> Result<()> {
    let Some((bs, unit)) = split_unit(m.ty) else { return Ok(()) };
    let nb = m.cols / unit;
    if !splits(m) {
        return Ok(());
    }
    let nrows = m.rows * m.n_mat.max(1);
    // Grid x is limited to 2^31-1 blocks; launch in slices of rows.
    let mut r0 = 0usize;
    while r0 < nrows {
        let cnt = (nrows - r0).min(1 << 30);
        let p = m.ptr + (r0 * m.row_bytes) as u64;
        g.launch("split_rows", (cnt as u32, 1, 1), 256, m.row_bytes as u32, &[A::P(p), A::I(nb as i32), A::I(bs as i32)])?;
        r0 += cnt;
    }
    m.split = true;
    Ok(())
}

/// The grouped expert GEMM kernel that reads `m`'s quantized blocks as stored, if there is one
/// (IQ2_XXS rows in the split layout, 4-byte aligned; Q2_K).
/// The `moe_gemm*` kernel `name` (64-token tiles) for tiles of `bt` (64 or 128) tokens.
fn moe_gemm_kernel(name: &'static str, bt: usize) -> &'static str {
    match (name, bt) {
        ("moe_gemm", 128) => "moe_gemm_t128",
        ("moe_gemm_iq2s", 128) => "moe_gemm_iq2s_t128",
        ("moe_gemm_q2k", 128) => "moe_gemm_q2k_t128",
        _ => name,
    }
}

/// Dynamic shared memory of a `moe_gemm*` kernel (moe_gemm.cu): two steps (K = 64 each, rows of 72
/// f16) of the tile's tokens' activations and of the 128 weight rows.
pub(crate) fn moe_gemm_smem(name: &str) -> u32 {
    let bt = if name.ends_with("_t128") { 128 } else { 64 };
    ((2 * bt * 72 + 2 * 128 * 72) * 2) as u32
}

/// Launches `moe_gemm*` kernel `name` (64-token tiles) for tiles of `bt` tokens.
pub(crate) fn launch_moe_gemm(g: &mut Gpu, name: &'static str, bt: usize, grid: (u32, u32, u32), args: &[A]) -> Result<()> {
    let name = moe_gemm_kernel(name, bt);
    g.launch(name, grid, 256, moe_gemm_smem(name), args)
}

pub(crate) fn grouped_direct(m: &DM) -> Option<&'static str> {
    if m.rows % 128 != 0 {
        return None;
    }
    match m.ty {
        GgmlType::IQ2_XXS if m.split && m.cols % 512 == 0 => Some("moe_gemm_iq2s"),
        GgmlType::Q2_K if m.cols % 256 == 0 => Some("moe_gemm_q2k"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dm(ty: GgmlType, rows: usize, cols: usize, split: bool) -> DM { DM { ptr: 0, ty, rows, cols, n_mat: 256, row_bytes: ty.row_bytes(cols).unwrap(), split } }

    /// Flash's routed experts take the grouped kernel once loaded (IQ2_XXS after the split, Q2_K as
    /// stored), so the stage needs no f16 expert scratch for them; the tiny model's do not.
    #[test]
    fn flash_experts_are_grouped_direct_once_split() {
        let gate = dm(GgmlType::IQ2_XXS, 2048, 4096, false);
        assert!(splits(&gate) && grouped_direct(&gate).is_none());
        assert_eq!(grouped_direct(&DM { split: true, ..gate }), Some("moe_gemm_iq2s"));
        assert_eq!(grouped_direct(&dm(GgmlType::Q2_K, 4096, 2048, false)), Some("moe_gemm_q2k"));
        let tiny = dm(GgmlType::IQ2_XXS, 256, 256, false);
        assert!(grouped_direct(&DM { split: splits(&tiny), ..tiny }).is_none());
        assert!(!splits(&DM { split: true, ..gate }), "split once");
    }

    /// Three 64-token blocks of the grouped GEMM fit an SM's 228 KiB (each with 1 KiB reserved and
    /// up to 3 KiB of static tables), two 128-token ones.
    #[test]
    fn grouped_gemm_shared_memory_fits() {
        assert!(3 * (moe_gemm_smem("moe_gemm_iq2s") + 4096) <= 228 * 1024);
        assert!(2 * (moe_gemm_smem("moe_gemm_iq2s_t128") + 4096) <= 228 * 1024);
        assert_eq!(moe_gemm_smem("moe_gemm_q2k"), moe_gemm_smem("moe_gemm"));
    }
}
