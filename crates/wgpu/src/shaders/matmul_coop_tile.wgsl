// The tile of the tiled products on cooperative matrices (tensor cores on NVIDIA, simdgroup matrices
// on Apple): the same BM rows x BN tokens (or slots) a workgroup of 256 as matmul_tile.wgsl, each
// thread loading for tile row and token lid / 4 (two chunks of 8 a column step of BK = 64), staged
// as f16 and multiplied by the 8 subgroups of 32 (`CN` x `CN` matrices, f32 accumulators): subgroup s takes row tile s / SPR and TPS token tiles from (s % SPR) * TPS.
// The outputs go through workgroup memory so the mains keep their per-thread 4 x 4 stores.
// Inputs are rounded to f16 (11-bit significands) before the products: the accuracy of a GEMM in f16
// with f32 sums, for prefill only (decode and short steps keep the mat-vec kernels).
const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 64u;
const WG: u32 = 256u;
const CN: u32 = COOP_Nu;
// Staged rows are BK + 8 halves apart: 16-byte aligned rows for the matrix loads, banks staggered.
const LS: u32 = 72u;
const SPR: u32 = 8u / (BM / CN);
const TPS: u32 = (BN / CN) / SPR;
var<workgroup> wh: array<f16, 4608>;   // BM x LS: [row][k]
var<workgroup> xh: array<f16, 4608>;   // BN x LS: [token][k]
var<workgroup> cs: array<f32, 4096>;   // BM x BN outputs: [token][row]
var<private> sg_id: u32;

// One column step's loads of a thread: chunks lid % 4 and lid % 4 + 4 (of 8) of its weight row and
// of its input row.
struct Fetch { w0: W8, w1: W8, xa0: vec4<f32>, xb0: vec4<f32>, xa1: vec4<f32>, xb1: vec4<f32> }

fn tile_fetch(lid: u32, ks: u32, wok: bool, rb: u32, xok: bool, xrow: u32) -> Fetch {
    let nchunks = p.cols / 8u;
    let z = vec4<f32>(0.0);
    var f = Fetch(W8(z, z), W8(z, z), z, z, z, z);
    let c0 = ks * 8u + lid % 4u;
    let c1 = c0 + 4u;
    if (c0 < nchunks) {
        if (wok) { f.w0 = load8(rb, c0); }
        if (xok) {
            f.xa0 = x[xrow + 2u * c0];
            f.xb0 = x[xrow + 2u * c0 + 1u];
        }
    }
    if (c1 < nchunks) {
        if (wok) { f.w1 = load8(rb, c1); }
        if (xok) {
            f.xa1 = x[xrow + 2u * c1];
            f.xb1 = x[xrow + 2u * c1 + 1u];
        }
    }
    return f;
}

fn stage8(o: u32, a: vec4<f32>, b: vec4<f32>, is_w: bool) {
    if (is_w) {
        wh[o + 0u] = f16(a.x); wh[o + 1u] = f16(a.y); wh[o + 2u] = f16(a.z); wh[o + 3u] = f16(a.w);
        wh[o + 4u] = f16(b.x); wh[o + 5u] = f16(b.y); wh[o + 6u] = f16(b.z); wh[o + 7u] = f16(b.w);
    } else {
        xh[o + 0u] = f16(a.x); xh[o + 1u] = f16(a.y); xh[o + 2u] = f16(a.z); xh[o + 3u] = f16(a.w);
        xh[o + 4u] = f16(b.x); xh[o + 5u] = f16(b.y); xh[o + 6u] = f16(b.z); xh[o + 7u] = f16(b.w);
    }
}

fn tile_stage(lid: u32, f: Fetch) {
    let o = (lid / 4u) * LS + (lid % 4u) * 8u;
    stage8(o, f.w0.a, f.w0.b, true);
    stage8(o + 32u, f.w1.a, f.w1.b, true);
    stage8(o, f.xa0, f.xb0, false);
    stage8(o + 32u, f.xa1, f.xb1, false);
}

// The whole column walk of a tile (as matmul_tile.wgsl's): returns this thread's 4 x 4 outputs, rows
// 4 (lid / 16) .., tokens 4 (lid % 16) .. of the tile. The next step's loads are issued before this
// step's products, so they are in flight while the matrices multiply.
fn tile_products(lid: u32, wok: bool, rb: u32, xok: bool, xrow: u32) -> array<vec4<f32>, 4> {
    // Accumulators start from zeros loaded from workgroup memory (no reliance on a zero constant).
    for (var i = lid; i < BM * BN; i += WG) { cs[i] = 0.0; }
    workgroupBarrier();
    let rt = sg_id / SPR;
    let tt0 = (sg_id % SPR) * TPS;
//ACC_DECL
    let nsteps = (p.cols / 8u + 7u) / 8u;
    var f = tile_fetch(lid, 0u, wok, rb, xok, xrow);
    for (var ks = 0u; ks < nsteps; ks++) {
        tile_stage(lid, f);
        workgroupBarrier();
        if (ks + 1u < nsteps) { f = tile_fetch(lid, ks + 1u, wok, rb, xok, xrow); }
        for (var kk = 0u; kk < BK; kk += CN) {
            let a = coopLoadT<coop_matNxN<f16, A>>(&wh[rt * CN * LS + kk], LS);
//ACC_MMA
        }
        workgroupBarrier();
    }
//ACC_STORE
    workgroupBarrier();
    let tr = lid / 16u;
    let tt = lid % 16u;
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            acc[i][j] = cs[(tt * 4u + j) * BM + tr * 4u + i];
        }
    }
    return acc;
}
