// Attention of one (token, head) per workgroup, as ds4_model::stage: the candidates of token t at
// position p = pos + t are its raw rows at positions max(0, p + 1 - swa) ..= p (before `pos` from the
// ring, row q % swa, else this step's new KV row q - pos), then the compressed rows: none (ratio 0),
// the first (p + 1) / ratio, or the indexer's top_k picks when an indexer is on and there are more
// than top_k. Rows are both K and V. Softmax over {q.row / sqrt(D)} and the head's sink logit,
// computed online over tiles of 64 candidates: a thread scores one candidate of the tile (dot from
// workgroup memory), then each thread accumulates its own output dims over the tile.
struct Params { n_head: u32, d: u32, swa: u32, ratio: u32, top_k: u32, scale: f32, sel_stride: u32, pad: u32 }
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kvn: array<f32>;
@group(0) @binding(2) var<storage, read> ring: array<f32>;
@group(0) @binding(3) var<storage, read> comp: array<f32>;
@group(0) @binding(4) var<storage, read> sel: array<u32>;
@group(0) @binding(5) var<storage, read> sinks: array<f32>;
@group(0) @binding(6) var<storage, read_write> o: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;
@group(0) @binding(8) var<uniform> step: Step;

const WG: u32 = 64u;
const MAXD: u32 = 512u;
const PER: u32 = MAXD / WG;
const SRC_RING: u32 = 0u;
const SRC_NEW: u32 = 1u;
const SRC_COMP: u32 = 2u;

var<workgroup> qs: array<f32, MAXD>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> src: array<u32, WG>;

// Value i of a candidate row (source in the top 2 bits, row index below).
fn row_val(s: u32, i: u32) -> f32 {
    let kind = s >> 30u;
    let off = (s & 0x3fffffffu) * p.d + i;
    if (kind == SRC_RING) { return ring[off]; }
    if (kind == SRC_NEW) { return kvn[off]; }
    return comp[off];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    if (t >= step.ntok) { return; }
    let d = p.d;
    let pos = step.pos + t;
    let qb = (t * p.n_head + h) * d;
    for (var i = lid; i < d; i += WG) { qs[i] = q[qb + i]; }
    workgroupBarrier();

    let start = select(0u, pos + 1u - p.swa, pos + 1u >= p.swa);
    let n_raw = pos + 1u - start;
    var nc = 0u;
    if (p.ratio != 0u) { nc = (pos + 1u) / p.ratio; }
    let picked = p.top_k != 0u && nc > p.top_k;
    let total = n_raw + select(nc, p.top_k, picked);

    var m = sinks[h];
    var den = 1.0;
    var acc: array<f32, PER>;
    for (var base = 0u; base < total; base += WG) {
        let c = base + lid;
        var s = 0.0;
        var code = 0u;
        if (c < total) {
            if (c < n_raw) {
                let qp = start + c;
                code = select((SRC_NEW << 30u) | (qp - step.pos), (SRC_RING << 30u) | (qp % p.swa), qp < step.pos);
            } else {
                let j = c - n_raw;
                code = (SRC_COMP << 30u) | select(j, sel[t * p.sel_stride + j], picked);
            }
            var dot = 0.0;
            for (var i = 0u; i < d; i++) { dot += qs[i] * row_val(code, i); }
            s = dot * p.scale;
        }
        sc[lid] = s;
        src[lid] = code;
        workgroupBarrier();
        let cnt = min(WG, total - base);
        var mt = m;
        for (var l = 0u; l < cnt; l++) { mt = max(mt, sc[l]); }
        let alpha = exp(m - mt);
        den *= alpha;
        for (var k = 0u; k < PER; k++) { acc[k] *= alpha; }
        for (var l = 0u; l < cnt; l++) {
            let e = exp(sc[l] - mt);
            den += e;
            let code_l = src[l];
            for (var k = 0u; k < PER; k++) {
                let i = lid + k * WG;
                if (i < d) { acc[k] += e * row_val(code_l, i); }
            }
        }
        m = mt;
        workgroupBarrier();
    }
    for (var k = 0u; k < PER; k++) {
        let i = lid + k * WG;
        if (i < d) { o[qb + i] = acc[k] / den; }
    }
}
