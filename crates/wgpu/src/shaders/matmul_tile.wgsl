// The tile of the tiled products (matmul_main.wgsl, matmul_expert_main.wgsl): a workgroup of 256 takes
// BM rows x BN tokens (or slots). Each column step of BK (4 chunks of 8), thread lid stages chunk
// lid % 4 of tile row lid / 4 (its dequantized weights) and the same columns of tile token lid / 4
// into workgroup memory, then every thread accumulates its 4 x 4 outputs: rows 4 (lid / 16) ..,
// tokens 4 (lid % 16) .. of the tile.
const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;
const WG: u32 = 256u;
var<workgroup> ws: array<vec4<f32>, 512>;   // BK x BM / 4: [k][rows 4r..4r+3]
var<workgroup> xs: array<vec4<f32>, 512>;   // BK x BN / 4: [k][tokens 4t..4t+3]

fn tile_stage(lid: u32, wv: W8, xa: vec4<f32>, xb: vec4<f32>) {
    let k0 = (lid % 4u) * 8u;
    let wi = lid / 16u;
    let wc = (lid / 4u) % 4u;
    ws[(k0 + 0u) * 16u + wi][wc] = wv.a.x;
    ws[(k0 + 1u) * 16u + wi][wc] = wv.a.y;
    ws[(k0 + 2u) * 16u + wi][wc] = wv.a.z;
    ws[(k0 + 3u) * 16u + wi][wc] = wv.a.w;
    ws[(k0 + 4u) * 16u + wi][wc] = wv.b.x;
    ws[(k0 + 5u) * 16u + wi][wc] = wv.b.y;
    ws[(k0 + 6u) * 16u + wi][wc] = wv.b.z;
    ws[(k0 + 7u) * 16u + wi][wc] = wv.b.w;
    xs[(k0 + 0u) * 16u + wi][wc] = xa.x;
    xs[(k0 + 1u) * 16u + wi][wc] = xa.y;
    xs[(k0 + 2u) * 16u + wi][wc] = xa.z;
    xs[(k0 + 3u) * 16u + wi][wc] = xa.w;
    xs[(k0 + 4u) * 16u + wi][wc] = xb.x;
    xs[(k0 + 5u) * 16u + wi][wc] = xb.y;
    xs[(k0 + 6u) * 16u + wi][wc] = xb.z;
    xs[(k0 + 7u) * 16u + wi][wc] = xb.w;
}

// The step's products, between the barriers that make the staged tiles visible and free them again.
fn tile_accumulate(lid: u32, acc: ptr<function, array<vec4<f32>, 4>>) {
    workgroupBarrier();
    let tr = lid / 16u;
    let tt = lid % 16u;
    for (var k = 0u; k < BK; k++) {
        let a = ws[k * 16u + tr];
        let b = xs[k * 16u + tt];
        (*acc)[0] += a.x * b;
        (*acc)[1] += a.y * b;
        (*acc)[2] += a.z * b;
        (*acc)[3] += a.w * b;
    }
    workgroupBarrier();
}

// The whole column walk of a tile: each step this thread loads chunk lid % 4 of its weight row at
// `rb` (when `wok`) and of its input row at `xrow` (when `xok`; zeros otherwise), stages them, and
// accumulates its 4 x 4 outputs, which it returns.
fn tile_products(lid: u32, wok: bool, rb: u32, xok: bool, xrow: u32) -> array<vec4<f32>, 4> {
    let nchunks = p.cols / 8u;
    var acc: array<vec4<f32>, 4>;
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
        tile_accumulate(lid, &acc);
    }
    return acc;
}
