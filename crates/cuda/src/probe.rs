//! Op-level probes of the matrix kernels for tests and benchmarks: the mat-vec and GEMM paths on given
//! weights, mat-vec timing at given shapes, and the device's streaming read bandwidth.
use crate::gpu::{Gpu, Result, A};
use crate::matvec::{cdiv, launch_dq, launch_mv, split_layout, DM};
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

/// Seconds per mat-vec call (one token) of the kernel the stage would use for a `ty` matrix stack of
/// `z` slots of `rows` × `cols` (weights are arbitrary bytes: only the timing is of interest), timed
/// with CUDA events over `reps` back-to-back launches.
pub fn bench_matvec(ty: GgmlType, rows: usize, cols: usize, z: usize, reps: usize) -> ds4_model::Result<f64> {
    (|| -> Result<f64> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        let wb = g.alloc_zeroed(row_bytes * rows * z)?;
        let mut m = DM { ptr: wb.ptr, ty, rows, cols, n_mat: z, row_bytes, split: false };
        split_layout(&mut g, &mut m)?;
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

