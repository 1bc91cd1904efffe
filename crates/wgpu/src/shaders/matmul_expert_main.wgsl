// Routed-expert products of a prefill chunk as tiled products (matmul_main.wgsl's tiles): a workgroup
// takes BM rows of one expert and a tile of up to BN slots that chose it (expert_groups with tiles of
// BN), so each weight is dequantized once per BN slots. y[slot][r] = W_id[r] . x[slot / x_div]. A row
// that lies in another binding part is left to that part's dispatch (an expert may straddle parts).
struct Expert {
    k: u32,
    x_div: u32,
    r_exp: u32,
    pad: u32,
}
@group(0) @binding(5) var<uniform> ex: Expert;
@group(0) @binding(6) var<storage, read> tiles: array<u32>;
@group(0) @binding(7) var<storage, read> order: array<u32>;

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;
const WG: u32 = 256u;
var<workgroup> ws: array<vec4<f32>, 512>;   // BK x BM / 4: [k][rows 4r..4r+3]
var<workgroup> xs: array<vec4<f32>, 512>;   // BK x BN / 4: [k][slots 4t..4t+3]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_prelude(lid);
    let r0 = (wid.x + wid.y * p.wg_x) * BM;
    let tile = wid.z;
    // Uniform exits only: every thread reaches the barriers. (step.ntok keeps the shared binding.)
    if (r0 >= ex.r_exp || tile >= tiles[0] || step.ntok == 0u) { return; }
    let id = tiles[1u + 3u * tile];
    let pos0 = tiles[2u + 3u * tile];
    let nt = min(tiles[3u + 3u * tile], BN);
    let nchunks = p.cols / 8u;
    let nks = (nchunks + 3u) / 4u;
    let lr = lid / 4u;
    let lc = lid % 4u;
    // The loader's weight row (global row g of the stack, in this part or not) and input slot.
    let g = id * ex.r_exp + r0 + lr;
    let wok = r0 + lr < ex.r_exp && g >= p.y_off && g - p.y_off < p.rows;
    let rb = p.w_off + select(0u, g - p.y_off, wok) * p.row_bytes;
    let xok = lr < nt;
    let xrow = (order[pos0 + min(lr, nt - 1u)] / ex.x_div) * p.x_stride4;
    let tr = lid / 16u;
    let tt = lid % 16u;
    var acc: array<vec4<f32>, 4>;
    for (var ks = 0u; ks < nks; ks++) {
        let c = ks * 4u + lc;
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
        let k0 = lc * 8u;
        let wi = lr / 4u;
        let wc = lr % 4u;
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
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let a = ws[k * 16u + tr];
            let b = xs[k * 16u + tt];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let r = r0 + tr * 4u + i;
        let gr = id * ex.r_exp + r;
        if (r < ex.r_exp && gr >= p.y_off && gr - p.y_off < p.rows) {
            for (var j = 0u; j < 4u; j++) {
                let t = tt * 4u + j;
                if (t < nt) { y[order[pos0 + t] * ex.r_exp + r] = acc[i][j]; }
            }
        }
    }
}
