//! Mat-vec and batched products on the test adapter against the CPU reference: the weights
//! dequantized by `ds4_quant::dequantize` (bit-exact vs gguf-py), dotted in f64. Every quant type,
//! with the adapter's features (subgroup reduction, unpack2x16float) and with every fallback, and
//! with a forced small binding limit so each tensor is split into several bindings.
//!
//! Bound: |y - ref| <= 1e-5 * sum_i |w_i x_i| per output. The GPU sums f32 in a tree of depth
//! <= 12 here (chunks, 8-wide dots, 64-way reduction), so its rounding error is below
//! ~12 * 2^-24 = 7e-7 of that sum; a wrong block decode is off by O(1).
mod common;

use ds4_quant::{GgmlType, MatRef, Precision};
use ds4_wgpu::ops::{MatVec, Product};
use ds4_wgpu::shaders::{F16Unpack, MATVEC_TYPES};
use ds4_wgpu::{GpuBuffer, ResidentTensor, Step};

const ROWS: usize = 70;
const ROWS_PER_PART: usize = 16;

/// Columns per type: odd block counts for Q8_0 / IQ2_XXS, so rows start at 2-mod-4 bytes.
fn cols_for(ty: GgmlType) -> usize {
    match ty {
        GgmlType::F16 => 264,
        GgmlType::Q8_0 => 32 * 9,
        _ => 256 * 3,
    }
}

/// Columns of the coop-tile cases: at least `COOP_MIN_COLS` (2048, where dense products take the
/// coop tile), again leaving partial blocks of rows at odd offsets and (F16) a partial column step.
fn coop_cols_for(ty: GgmlType) -> usize {
    match ty {
        GgmlType::F16 => 2056,
        GgmlType::Q8_0 => 32 * 65,
        _ => 256 * 9,
    }
}

fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let nb = rows * cols / ty.block_elems();
    ds4_quant::random_valid_blocks(ty, seed, nb)
}

/// (max error / bound ratio, max absolute error) of y against the f64 reference of W x_t.
fn compare(ty: GgmlType, w: &[u8], rows: usize, cols: usize, x: &[f32], y: &[f32], ntok: usize) -> (f64, f64) {
    compare_inputs(ty, w, rows, cols, x, y, ntok, false)
}

/// As `compare`; with `round16` the reference takes the weights and inputs rounded to f16 (the coop
/// tiles' inputs), so the same f32-summation bound holds for them.
#[allow(clippy::too_many_arguments)]
fn compare_inputs(ty: GgmlType, w: &[u8], rows: usize, cols: usize, x: &[f32], y: &[f32], ntok: usize, round16: bool) -> (f64, f64) {
    let mut deq = vec![0f32; rows * cols];
    ds4_quant::dequantize(ty, w, &mut deq).expect("dequantize");
    let h = |v: f32| if round16 { half::f16::from_f32(v).to_f32() } else { v };
    let x16: Vec<f32> = x.iter().map(|&v| h(v)).collect();
    let x = if round16 { &x16[..] } else { x };
    let (mut worst, mut max_abs) = (0f64, 0f64);
    for t in 0..ntok {
        let xt = &x[t * cols..(t + 1) * cols];
        // The library's own f32 reference path must agree too (a second, independent CPU result).
        let mut exact = vec![0f32; rows];
        ds4_quant::matvec(&MatRef::new(ty, w, rows, cols).expect("matref"), xt, &mut exact, Precision::Exact);
        for r in 0..rows {
            let wr = &deq[r * cols..(r + 1) * cols];
            let refv: f64 = wr.iter().zip(xt).map(|(&a, &b)| h(a) as f64 * b as f64).sum();
            let mag: f64 = wr.iter().zip(xt).map(|(&a, &b)| (h(a) as f64 * b as f64).abs()).sum();
            let got = y[t * rows + r] as f64;
            let err = (got - refv).abs();
            if !round16 {
                assert!((exact[r] as f64 - refv).abs() <= 1e-5 * mag, "CPU exact path disagrees with the f64 reference");
            }
            worst = common::worse(worst, err / (1e-5 * mag));
            max_abs = common::worse(max_abs, err);
        }
    }
    (worst, max_abs)
}

fn run_type(ty: GgmlType, fallback: bool) {
    let cols = cols_for(ty);
    let row_bytes = ty.row_bytes(cols).expect("row bytes") as u64;
    // A binding holds 16 rows (+ the 4-byte tail pad): 70 rows become 5 parts.
    let Some(gpu) = common::gpu(common::opts(fallback, Some(row_bytes * ROWS_PER_PART as u64 + 4))) else { return };
    let w = weights(ty, ROWS, cols, 7 + ty as u64);
    let t = ResidentTensor::upload(&gpu, "w", ty, &w, ROWS, cols).expect("upload");
    assert_eq!(t.parts.len(), ROWS.div_ceil(ROWS_PER_PART), "{}: tensor not split as expected", ty.name());
    assert!(t.parts.iter().all(|p| p.rows <= ROWS_PER_PART));

    // One token.
    let x1 = common::normals(100 + ty as u64, cols);
    let xb = GpuBuffer::from_slice(&gpu, "x", &x1).expect("x");
    let yb = GpuBuffer::new(&gpu, "y", ROWS).expect("y");
    let mv = MatVec::new(&gpu, &t, &xb, &yb, Product::Vec).expect("matvec op");
    let want_f16 = if fallback { F16Unpack::Bits } else { F16Unpack::Native };
    assert_eq!(mv.f16, want_f16);
    gpu.run(Step { ntok: 1, pos: 0 }, |e| mv.encode(e)).expect("run");
    let y = yb.read(&gpu, ROWS).expect("read");
    let (ratio, abs) = compare(ty, &w, ROWS, cols, &x1, &y, 1);
    eprintln!("{} vec fallback={fallback}: max err {abs:.3e}, {ratio:.4} of the bound", ty.name());
    assert!(ratio <= 1.0, "{} mat-vec (fallback={fallback}): error {ratio} x the bound", ty.name());

    // A batch of 6 tokens (one full tile of 4 and a partial one), op built for up to 8.
    let ntok = 6;
    let xs = common::normals(200 + ty as u64, 8 * cols);
    let xbb = GpuBuffer::from_slice(&gpu, "xs", &xs).expect("xs");
    let ybb = GpuBuffer::new(&gpu, "ys", 8 * ROWS).expect("ys");
    let mm = MatVec::new(&gpu, &t, &xbb, &ybb, Product::Batched { max_tokens: 8 }).expect("batched op");
    let before = gpu.counters();
    for _ in 0..3 {
        gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| mm.encode(e)).expect("run batched");
    }
    let after = gpu.counters();
    // Nothing uploaded, bound, compiled or allocated per step: one uniform write and one submit each.
    assert_eq!(
        (after.weight_uploads, after.bind_groups, after.pipelines, after.buffers),
        (before.weight_uploads, before.bind_groups, before.pipelines, before.buffers)
    );
    assert_eq!((after.step_writes - before.step_writes, after.submits - before.submits), (3, 3));
    let ys = ybb.read(&gpu, ntok * ROWS).expect("read");
    let (ratio, abs) = compare(ty, &w, ROWS, cols, &xs, &ys, ntok);
    eprintln!("{} batched fallback={fallback}: max err {abs:.3e}, {ratio:.4} of the bound", ty.name());
    assert!(ratio <= 1.0, "{} batched (fallback={fallback}): error {ratio} x the bound", ty.name());
    // Too many tokens for the op is an error, not a panic or an overrun.
    let r = gpu.run(Step { ntok: 9, pos: 0 }, |e| mm.encode(e));
    assert!(r.is_err());
}

#[test]
fn f16() {
    run_type(GgmlType::F16, false);
    run_type(GgmlType::F16, true);
}
#[test]
fn q8_0() {
    run_type(GgmlType::Q8_0, false);
    run_type(GgmlType::Q8_0, true);
}
#[test]
fn q2_k() {
    run_type(GgmlType::Q2_K, false);
    run_type(GgmlType::Q2_K, true);
}
#[test]
fn q4_k() {
    run_type(GgmlType::Q4_K, false);
    run_type(GgmlType::Q4_K, true);
}
#[test]
fn iq2_xxs() {
    run_type(GgmlType::IQ2_XXS, false);
    run_type(GgmlType::IQ2_XXS, true);
}

#[test]
fn every_matvec_type_is_tested() {
    assert_eq!(MATVEC_TYPES, [GgmlType::F16, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS]);
}

/// Every workgroup shape (threads a row x rows a thread) against the reference, one token and a
/// batch, on tensors split over bindings; a token's row in the batch equals its mat-vec bit for bit
/// (decode and short steps sum in the same order), and so do the rows of every rows-per-thread
/// variant of one segment width (a row's sum does not depend on which thread takes it). Q8_0 takes
/// every shape; the other types and the fallbacks two segment widths (CI time on lavapipe).
#[test]
fn every_workgroup_shape() {
    use ds4_wgpu::shaders::matvec_shapes;
    let cases = [(GgmlType::Q8_0, 70, 32 * 9), (GgmlType::IQ2_XXS, 40, 256 * 3), (GgmlType::F16, 24, 264)];
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for fallback in [false, true] {
        for (i, &(ty, rows, cols)) in cases.iter().enumerate() {
            let row_bytes = ty.row_bytes(cols).expect("row bytes") as u64;
            let Some(gpu) = common::gpu(common::opts(fallback, Some(row_bytes * ROWS_PER_PART as u64 + 4))) else { return };
            let w = weights(ty, rows, cols, 50 + i as u64);
            let t = ResidentTensor::upload(&gpu, "w", ty, &w, rows, cols).expect("upload");
            let ntok = 5;
            let xs = common::normals(300 + i as u64, ntok * cols);
            let xb = GpuBuffer::from_slice(&gpu, "xs", &xs).expect("xs");
            let x1 = GpuBuffer::from_slice(&gpu, "x1", &xs[(ntok - 1) * cols..]).expect("x1");
            let mut by_seg: Vec<(u32, Vec<u32>)> = Vec::new();
            for shape in matvec_shapes().into_iter().filter(|s| (ty == GgmlType::Q8_0 && !fallback) || s.seg == 8 || s.seg == 64) {
                let yb = GpuBuffer::new(&gpu, "ys", ntok * rows).expect("ys");
                let mm = MatVec::with_shape(&gpu, &t, &xb, &yb, Product::Batched { max_tokens: ntok as u32 }, shape).expect("batched op");
                gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| mm.encode(e)).expect("run batched");
                let ys = yb.read(&gpu, ntok * rows).expect("read");
                let (ratio, abs) = compare(ty, &w, rows, cols, &xs, &ys, ntok);
                eprintln!("{} {rows}x{cols} {shape:?} fallback={fallback}: max err {abs:.3e}, {ratio:.4} of the bound", ty.name());
                assert!(ratio <= 1.0, "{} {rows}x{cols} {shape:?}: error {ratio} x the bound", ty.name());
                let y1 = GpuBuffer::new(&gpu, "y1", rows).expect("y1");
                let mv = MatVec::with_shape(&gpu, &t, &x1, &y1, Product::Vec, shape).expect("matvec op");
                gpu.run(Step { ntok: 1, pos: 0 }, |e| mv.encode(e)).expect("run");
                let y = bits(&y1.read(&gpu, rows).expect("read"));
                assert_eq!(y, bits(&ys[(ntok - 1) * rows..]), "{} {rows}x{cols} {shape:?}: the last token alone differs from its batch row", ty.name());
                match by_seg.iter().find(|(s, _)| *s == shape.seg) {
                    Some((_, other)) => assert_eq!(&y, other, "{} {shape:?}: rows differ between rows-per-thread variants", ty.name()),
                    None => by_seg.push((shape.seg, y)),
                }
            }
        }
    }
}

/// A grouped product (rows of group g take inputs [g * cols, (g + 1) * cols) of each activation row)
/// under every rows-per-thread, with groups that a thread's rows straddle (6 rows a group against 4
/// or 8 rows a thread) and bindings that end inside a group: against the reference, one token and a
/// batch, and a token's batch row equal to its mat-vec bit for bit.
#[test]
fn grouped_products_every_rows_per_thread() {
    use ds4_wgpu::shaders::MatVecShape;
    let (ty, rows, cols, group_rows) = (GgmlType::Q8_0, 48, 64, 6);
    let stride = rows / group_rows * cols;
    let row_bytes = ty.row_bytes(cols).expect("row bytes") as u64;
    let Some(gpu) = common::gpu(common::opts(false, Some(row_bytes * 20 + 4))) else { return };
    let w = weights(ty, rows, cols, 90);
    let t = ResidentTensor::upload(&gpu, "w", ty, &w, rows, cols).expect("upload");
    assert!(t.parts.len() >= 3);
    let mut deq = vec![0f32; rows * cols];
    ds4_quant::dequantize(ty, &w, &mut deq).expect("dequantize");
    let ntok = 3;
    let xs = common::normals(700, ntok * stride);
    let xb = GpuBuffer::from_slice(&gpu, "xs", &xs).expect("xs");
    let x1 = GpuBuffer::from_slice(&gpu, "x1", &xs[(ntok - 1) * stride..]).expect("x1");
    for rows_per_thread in [1, 2, 4, 8] {
        let shape = MatVecShape { seg: 8, rows_per_thread };
        let yb = GpuBuffer::new(&gpu, "ys", ntok * rows).expect("ys");
        let op = MatVec::grouped_with_shape(&gpu, &t, &xb, &yb, Product::Batched { max_tokens: ntok as u32 }, group_rows, stride, shape).expect("grouped op");
        gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| op.encode(e)).expect("run");
        let ys = yb.read(&gpu, ntok * rows).expect("read");
        for i in 0..ntok {
            for r in 0..rows {
                let xin = &xs[i * stride + (r / group_rows) * cols..][..cols];
                let wr = &deq[r * cols..(r + 1) * cols];
                let want: f64 = wr.iter().zip(xin).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wr.iter().zip(xin).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let err = (ys[i * rows + r] as f64 - want).abs() / (1e-5 * mag);
                assert!(err <= 1.0, "{shape:?} token {i} row {r}: {err} x the bound");
            }
        }
        let y1 = GpuBuffer::new(&gpu, "y1", rows).expect("y1");
        let one = MatVec::grouped_with_shape(&gpu, &t, &x1, &y1, Product::Vec, group_rows, stride, shape).expect("grouped op");
        gpu.run(Step { ntok: 1, pos: 0 }, |e| one.encode(e)).expect("run");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y1.read(&gpu, rows).expect("read")), bits(&ys[(ntok - 1) * rows..]), "{shape:?}: mat-vec differs from its batch row");
    }
}

/// The shapes picked for Flash's products (the best or within 10 % of the best of every shape in a
/// sweep on an H100): up to 8 rows a thread while 256 workgroups remain, two units a thread for the
/// largest matrices.
#[test]
fn flash_shapes() {
    use ds4_wgpu::shaders::{matvec_shape, MatVecShape};
    let s = |seg, rows_per_thread| MatVecShape { seg, rows_per_thread };
    assert_eq!(matvec_shape(GgmlType::Q8_0, 1024, 4096), s(128, 2)); // q_a
    assert_eq!(matvec_shape(GgmlType::Q8_0, 512, 4096), s(128, 1)); // kv
    assert_eq!(matvec_shape(GgmlType::Q8_0, 32768, 1024), s(16, 8)); // q_b
    assert_eq!(matvec_shape(GgmlType::Q8_0, 4096, 8192), s(128, 8)); // out_b
    assert_eq!(matvec_shape(GgmlType::Q8_0, 2048, 4096), s(128, 4)); // shared expert gate / up
    assert_eq!(matvec_shape(GgmlType::Q8_0, 4096, 2048), s(64, 4)); // shared expert down
    assert_eq!(matvec_shape(GgmlType::Q8_0, 129280, 4096), s(64, 8)); // head
    assert_eq!(matvec_shape(GgmlType::F16, 24, 16384), s(256, 1)); // HC mix
    // Routed experts (6 slots of 2048 x 4096 gate / up, 4096 x 2048 down).
    assert_eq!(ds4_wgpu::shaders::expert_shape(GgmlType::IQ2_XXS, 2048, 4096, 6), s(64, 8));
    assert_eq!(ds4_wgpu::shaders::expert_shape(GgmlType::Q2_K, 4096, 2048, 6), s(32, 8));
}

/// The kernels compiled without naga's runtime checks (the default) give the results of the checked
/// ones bit for bit, for every quant type, one token and a batch, on tensors split over bindings:
/// nothing they read depends on a clamp.
#[test]
fn unchecked_kernels_match_checked() {
    let mut outs = Vec::new();
    for checked in [false, true] {
        let mut opts = common::opts(false, None);
        opts.runtime_checks = checked;
        let Some(gpu) = common::gpu(opts) else { return };
        let mut out = Vec::new();
        for ty in MATVEC_TYPES {
            let cols = cols_for(ty);
            let w = weights(ty, ROWS, cols, 80 + ty as u64);
            let t = ResidentTensor::upload(&gpu, "w", ty, &w, ROWS, cols).expect("upload");
            let ntok = 3;
            let xs = common::normals(400 + ty as u64, ntok * cols);
            let xb = GpuBuffer::from_slice(&gpu, "xs", &xs).expect("xs");
            let yb = GpuBuffer::new(&gpu, "ys", ntok * ROWS).expect("ys");
            let mm = MatVec::new(&gpu, &t, &xb, &yb, Product::Batched { max_tokens: ntok as u32 }).expect("batched op");
            let y1 = GpuBuffer::new(&gpu, "y1", ROWS).expect("y1");
            let mv = MatVec::new(&gpu, &t, &xb, &y1, Product::Vec).expect("matvec op");
            gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| mm.encode(e)).expect("run batched");
            gpu.run(Step { ntok: 1, pos: 0 }, |e| mv.encode(e)).expect("run");
            let ys = yb.read(&gpu, ntok * ROWS).expect("read");
            let (ratio, _) = compare(ty, &w, ROWS, cols, &xs, &ys, ntok);
            assert!(ratio <= 1.0, "{} checked={checked}: error {ratio} x the bound", ty.name());
            out.push(ys.iter().chain(&y1.read(&gpu, ROWS).expect("read")).map(|f| f.to_bits()).collect::<Vec<_>>());
        }
        outs.push(out);
    }
    if outs.len() == 2 {
        assert_eq!(outs[0], outs[1], "unchecked kernels differ from checked ones");
    }
}

/// The tiled product (prefill steps of 16+ tokens) against the CPU reference: every quant type and
/// f16 decode, rows and tokens that leave partial tiles (70 rows in parts of 16, 70 and 17 tokens),
/// columns that leave a partial column step (F16: 33 chunks of 8): the f32 tiles with and without
/// subgroups, and the cooperative-matrix tiles where the adapter has them (against the product of
/// the f16-rounded inputs: the same f32-summation bound then holds).
#[test]
fn tiled_product_matches_cpu() {
    let coop_off = ds4_wgpu::wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    for mode in ["fallback", "f32 tiles", "coop"] {
        // One device per mode (NVIDIA's driver refused new devices after ~25 in one process); 8 KiB
        // bindings split every type's 70 rows into several parts.
        let mut o = common::opts(mode == "fallback", Some(8 << 10));
        if mode == "f32 tiles" {
            o.disable |= coop_off;
        }
        let Some(gpu) = common::gpu(o) else { return };
        let coop = mode == "coop";
        if coop && gpu.caps().coop.is_none() {
            eprintln!("no cooperative matrices on {}: coop tiles not tested", gpu.caps().adapter);
            return;
        }
        for ty in MATVEC_TYPES {
            let cols = if coop { coop_cols_for(ty) } else { cols_for(ty) };
            let w = weights(ty, ROWS, cols, 60 + ty as u64);
            let t = ResidentTensor::upload(&gpu, "w", ty, &w, ROWS, cols).expect("upload");
            assert!(t.parts.len() >= 2, "{}: 70 rows should be split", ty.name());
            let m = 70;
            let xs = common::normals(500 + ty as u64, m * cols);
            let xb = GpuBuffer::from_slice(&gpu, "xs", &xs).expect("xs");
            let yb = GpuBuffer::new(&gpu, "ys", m * ROWS).expect("ys");
            let mm = MatVec::new(&gpu, &t, &xb, &yb, Product::Batched { max_tokens: m as u32 }).expect("batched op");
            for ntok in [m, 17] {
                yb.write(&gpu, &vec![f32::NAN; m * ROWS]).expect("clear");
                gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| mm.encode(e)).expect("run");
                let ys = yb.read(&gpu, ntok * ROWS).expect("read");
                let (ratio, abs) = compare_inputs(ty, &w, ROWS, cols, &xs, &ys, ntok, coop);
                eprintln!("{} tiled {ntok} tokens {mode}: max err {abs:.3e}, {ratio:.4} of the bound", ty.name());
                assert!(ratio <= 1.0, "{} tiled product, {ntok} tokens ({mode}): error {ratio} x the bound", ty.name());
                if coop {
                    // The same outputs against the unrounded inputs: how far f16 inputs move them.
                    let (r32, a32) = compare(ty, &w, ROWS, cols, &xs, &ys, ntok);
                    eprintln!("{} coop {ntok} tokens vs f32 inputs: max err {a32:.3e}, {r32:.3} x the f32 bound", ty.name());
                }
            }
        }
    }
}

/// The probes of `cooperative_matrix_layouts` for side `n`: (name, whether out[c n + r] holds m(c, r)
/// rather than m(r, c)) per probe, and the module. Probe k leaves its matrix in out[k n n ..] through
/// the confirmed column-major store; the last one stores the control's matrix row-major instead.
fn coop_layout_probes(n: u32) -> (Vec<(&'static str, bool)>, String) {
    let nn = n * n;
    let (a, b, c) = (format!("coop_mat{n}x{n}<f16, A>"), format!("coop_mat{n}x{n}<f16, B>"), format!("coop_mat{n}x{n}<f32, C>"));
    let control = format!("coopMultiplyAdd(coopLoadT<{a}>(&mh[0], N), coopLoad<{b}>(&eh[0], N), z)");
    let probes = [
        ("coopLoad A (column-major)", format!("coopMultiplyAdd(coopLoad<{a}>(&mh[0], N), coopLoad<{b}>(&eh[0], N), z)"), true),
        ("coopLoadT B (row-major)", format!("coopMultiplyAdd(coopLoadT<{a}>(&eh[0], N), coopLoadT<{b}>(&mh[0], N), z)"), false),
        ("coopLoad C (column-major)", format!("coopLoad<{c}>(&mf[0], N)"), true),
        ("coopLoadT C (row-major)", format!("coopLoadT<{c}>(&mf[0], N)"), false),
        ("control: coopLoadT A, coopLoad B, coopStore C", control.clone(), false),
    ];
    let mut body = String::new();
    for (k, (_, m, _)) in probes.iter().enumerate() {
        body += &format!("    coopStore({m}, &cs[{}u], N);\n", k as u32 * nn);
    }
    let k = probes.len() as u32;
    body += &format!("    coopStoreT({control}, &cs[{}u], N);\n", k * nn);
    let total = (k + 1) * nn;
    let wgsl = format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\nconst N: u32 = {n}u;\n@group(0) @binding(0) var<storage, read_write> out: array<f32>;\n\
         var<workgroup> mh: array<f16, {nn}>;\nvar<workgroup> eh: array<f16, {nn}>;\nvar<workgroup> mf: array<f32, {nn}>;\nvar<workgroup> cs: array<f32, {total}>;\n\
         @compute @workgroup_size(32)\nfn main(@builtin(local_invocation_index) lid: u32) {{\n\
         for (var e = lid; e < N * N; e += 32u) {{ mh[e] = f16(f32(e)); mf[e] = f32(e); eh[e] = select(f16(0.0), f16(1.0), e / N == e % N); cs[e] = 0.0; }}\n\
         workgroupBarrier();\n    let z = coopLoad<{c}>(&cs[0], N);\n    workgroupBarrier();\n{body}    workgroupBarrier();\n\
         for (var e = lid; e < {total}u; e += 32u) {{ out[e] = cs[e]; }}\n}}\n"
    );
    let names = probes.iter().map(|p| (p.0, p.2)).chain([("coopStoreT C (row-major)", true)]).collect();
    (names, wgsl)
}

/// The cooperative-matrix load and store forms against their definitions (SPIR-V KHR layouts:
/// row-major (r, c) at `p[r * stride + c]`, column-major at `p[c * stride + r]`), one subgroup of 32 at
/// the adapter's side N: every form a kernel may use, each read back through forms the coop tiles have
/// confirmed on the H100 (`coopLoadT` A, `coopLoad` B, `coopStore` C). m(r, c) = r N + c (exact in
/// f16), the identity from the same forms. The modules are validated by naga everywhere; they run
/// only where the adapter has cooperative matrices (not lavapipe).
#[test]
fn cooperative_matrix_layouts() {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    for n in [8u32, 16] {
        let (_, wgsl) = coop_layout_probes(n);
        let module = naga::front::wgsl::parse_str(&wgsl).unwrap_or_else(|e| panic!("probe {n}: {}", e.emit_to_string(&wgsl)));
        Validator::new(ValidationFlags::all(), Capabilities::COOPERATIVE_MATRIX | Capabilities::SHADER_FLOAT16)
            .validate(&module)
            .unwrap_or_else(|e| panic!("probe {n}: {}", e.emit_to_string(&wgsl)));
    }
    let Some(gpu) = common::gpu(ds4_wgpu::GpuOptions::default()) else { return };
    let Some(side) = gpu.caps().coop else {
        eprintln!("no cooperative matrices on {}: layouts not probed", gpu.caps().adapter);
        return;
    };
    let (names, wgsl) = coop_layout_probes(side);
    let n = side as usize;
    let out = gpu.run_probe("coop layouts", &wgsl, 1, names.len() * n * n).expect("probe");
    let mut wrong = Vec::new();
    for (k, &(name, transposed)) in names.iter().enumerate() {
        let got = &out[k * n * n..(k + 1) * n * n];
        let want = |r: usize, c: usize| if transposed { (c * n + r) as f32 } else { (r * n + c) as f32 };
        let ok = (0..n).all(|r| (0..n).all(|c| got[c * n + r] == want(r, c)));
        eprintln!("{name}: {}", if ok { "as defined" } else { "NOT as defined" });
        if !ok {
            wrong.push(name);
        }
    }
    assert!(wrong.is_empty(), "cooperative-matrix forms not as defined on {}: {wrong:?}", gpu.caps().adapter);
}
