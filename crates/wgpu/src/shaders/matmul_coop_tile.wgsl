// The tile of the tiled products on cooperative matrices (tensor cores on NVIDIA, simdgroup matrices
// on Apple): the same BM rows x BN tokens (or slots) a workgroup of 256 and the same loading as
// matmul_tile.wgsl (thread lid stages chunk lid % 4 of tile row lid / 4 and of tile token lid / 4 each
// column step of BK), but staged as f16 and multiplied by the 8 subgroups of 32 (`CN` x `CN` matrices,
// f32 accumulators): subgroup s takes row tile s / SPR and TPS token tiles from (s % SPR) * TPS.
// The outputs go through workgroup memory so the mains keep their per-thread 4 x 4 stores.
// Inputs are rounded to f16 (11-bit significands) before the products: the accuracy of a GEMM in f16
// with f32 sums, for prefill only (decode and short steps keep the mat-vec kernels).
const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;
const WG: u32 = 256u;
const CN: u32 = COOP_Nu;
// Staged rows are BK + 8 halves apart: 16-byte aligned rows for the matrix loads, banks staggered.
const LS: u32 = 40u;
const SPR: u32 = 8u / (BM / CN);
const TPS: u32 = (BN / CN) / SPR;
var<workgroup> wh: array<f16, 2560>;   // BM x LS: [row][k]
var<workgroup> xh: array<f16, 2560>;   // BN x LS: [token][k]
var<workgroup> cs: array<f32, 4096>;   // BM x BN outputs: [token][row]
var<private> sg_id: u32;

fn tile_stage(lid: u32, wv: W8, xa: vec4<f32>, xb: vec4<f32>) {
    let o = (lid / 4u) * LS + (lid % 4u) * 8u;
    wh[o + 0u] = f16(wv.a.x);
    wh[o + 1u] = f16(wv.a.y);
    wh[o + 2u] = f16(wv.a.z);
    wh[o + 3u] = f16(wv.a.w);
    wh[o + 4u] = f16(wv.b.x);
    wh[o + 5u] = f16(wv.b.y);
    wh[o + 6u] = f16(wv.b.z);
    wh[o + 7u] = f16(wv.b.w);
    xh[o + 0u] = f16(xa.x);
    xh[o + 1u] = f16(xa.y);
    xh[o + 2u] = f16(xa.z);
    xh[o + 3u] = f16(xa.w);
    xh[o + 4u] = f16(xb.x);
    xh[o + 5u] = f16(xb.y);
    xh[o + 6u] = f16(xb.z);
    xh[o + 7u] = f16(xb.w);
}

// The whole column walk of a tile (as matmul_tile.wgsl's): returns this thread's 4 x 4 outputs, rows
// 4 (lid / 16) .., tokens 4 (lid % 16) .. of the tile.
fn tile_products(lid: u32, wok: bool, rb: u32, xok: bool, xrow: u32) -> array<vec4<f32>, 4> {
    // Accumulators start from zeros loaded from workgroup memory (no reliance on a zero constant).
    for (var i = lid; i < BM * BN; i += WG) { cs[i] = 0.0; }
    workgroupBarrier();
    let rt = sg_id / SPR;
    let tt0 = (sg_id % SPR) * TPS;
//ACC_DECL
    let nchunks = p.cols / 8u;
    for (var ks = 0u; ks < (nchunks + 3u) / 4u; ks++) {
        let c = ks * 4u + lid % 4u;
        var wv = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        var xa = vec4<f32>(0.0);
        var xb = vec4<f32>(0.0);
        if (c < nchunks) {
            if (wok) { wv = load8(rb, c); }
            if (xok) {
                xa = x[xrow + 2u * c];
                xb = x[xrow + 2u * c + 1u];
            }
        }
        tile_stage(lid, wv, xa, xb);
        workgroupBarrier();
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
