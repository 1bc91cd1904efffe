// Combines the splits of attention.wgsl for (token, head): o = sum_s acc_s e^(m_s - M) /
// sum_s den_s e^(m_s - M), M = max_s m_s. Nothing to do with one split (the splits wrote o).
struct Params {
    n_head: u32, d: u32, swa: u32, ratio: u32,
    top_k: u32, scale: f32, groups: u32, splits: u32,
    short_step: u32, pad0: u32, pad1: u32, pad2: u32,
}
struct Step { ntok: u32, pos: u32, batch: u32, slot: u32 }
@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;

// As attention.wgsl: short steps (up to p.short_step tokens) and batched steps split each row as a
// one-token step does (p.splits); longer steps do not split.
fn nsplit_of(ntok: u32) -> u32 {
    return select(p.splits, 1u, ntok > p.short_step && step.batch == 0u);
}

// Each split's factor e^(m_s - M) is computed once (thread s) and shared; the sums keep split order.
const MAX_SPLITS: u32 = 64u;
var<workgroup> fs: array<f32, MAX_SPLITS>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let nsplit = nsplit_of(step.ntok);
    if (t >= step.ntok || nsplit == 1u) { return; }
    let d = p.d;
    let stride = p.n_head * (d + 2u);
    let b0 = (t * nsplit * p.n_head + h) * (d + 2u);
    var mx = part[b0 + d];
    for (var s = 1u; s < nsplit; s++) { mx = max(mx, part[b0 + s * stride + d]); }
    for (var s = lid; s < nsplit; s += 64u) { fs[s] = exp(part[b0 + s * stride + d] - mx); }
    workgroupBarrier();
    var den = 0.0;
    for (var s = 0u; s < nsplit; s++) {
        den += part[b0 + s * stride + d + 1u] * fs[s];
    }
    for (var i = lid; i < d; i += 64u) {
        var a = 0.0;
        for (var s = 0u; s < nsplit; s++) {
            a += part[b0 + s * stride + i] * fs[s];
        }
        o[(t * p.n_head + h) * d + i] = a / den;
    }
}
