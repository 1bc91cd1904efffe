// Per row, in place: RMS norm (none, plain, or times a weight) -> RoPE on the last 2 * npairs values
// at the row's position -> QAT (none; FP8 E4M3 on the first `dim - 2 * npairs` values in blocks of
// 64; or Walsh-Hadamard of the whole row then FP4 E2M1 in blocks of 32), as the CPU stage does for
// the KV row, the query heads, the compressed rows and the indexer query / rows.
// Rows: token rows (ratio = 0): row r of the step is token r / per_tok at that token's position;
// window rows (ratio > 0): the rows of windows closed in this step, c in [pos / ratio,
// (pos + ntok) / ratio) of each sequence (seq.wgsl; row c of slot s is row s * cap + c of the
// buffer), at position c * ratio (the window's start). A batched step gives workgroup k sequence k
// (its one token closes at most one window).
struct Params { dim: u32, norm: u32, npairs: u32, qat: u32, per_tok: u32, ratio: u32, eps: f32, wg_x: u32, hscale: f32, cap: u32, pad1: u32, pad2: u32 }
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> turns: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

const WG: u32 = 256u;
const MAXD: u32 = 1024u;
var<workgroup> v: array<f32, MAXD>;
var<workgroup> red: array<f32, WG>;

// Absolute maximum of v[b0 .. b0 + n).
fn block_amax(b0: u32, n: u32) -> f32 {
    var m = 0.0;
    for (var i = 0u; i < n; i++) { m = max(m, abs(v[b0 + i])); }
    return m;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let k = wid.x + wid.y * p.wg_x;
    var row: u32;
    var pos: u32;
    if (p.ratio == 0u) {
        if (k >= step.ntok * p.per_tok) { return; }
        row = k;
        pos = row_pos(k / p.per_tok);
    } else {
        let batched = step.batch != 0u;
        let g = select(0u, k, batched);
        if (g >= seq_count()) { return; }
        let s = seq_at(g);
        let c = s.pos / p.ratio + select(k, 0u, batched);
        if (c >= (s.pos + s.n) / p.ratio) { return; }
        row = s.slot * p.cap + c;
        pos = c * p.ratio;
    }
    let n = p.dim;
    let base = row * n;
    for (var i = lid; i < n; i += WG) { v[i] = x[base + i]; }
    workgroupBarrier();
    if (p.norm != 0u) {
        var ss = 0.0;
        for (var i = lid; i < n; i += WG) { ss += v[i] * v[i]; }
        red[lid] = ss;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (lid < s) { red[lid] += red[lid + s]; }
            workgroupBarrier();
        }
        let inv = 1.0 / sqrt(red[0] / f32(n) + p.eps);
        for (var i = lid; i < n; i += WG) {
            var y = v[i] * inv;
            if (p.norm == 2u) { y = y * g[i]; }
            v[i] = y;
        }
        workgroupBarrier();
    }
    let tail = n - 2u * p.npairs;
    for (var j = lid; j < p.npairs; j += WG) {
        let sc = sincos_turns(turns_of(pos, turns[j]));
        let a = tail + 2u * j;
        let x0 = v[a];
        let x1 = v[a + 1u];
        v[a] = x0 * sc.y - x1 * sc.x;
        v[a + 1u] = x0 * sc.x + x1 * sc.y;
    }
    workgroupBarrier();
    if (p.qat == 1u) {
        // FP8 on the non-rotated part, blocks of 64 (the last one may be short).
        for (var i = lid; i < tail; i += WG) {
            let b0 = i / 64u * 64u;
            let amax = max(block_amax(b0, min(64u, tail - b0)), 1e-4);
            let e = scale_exp(amax, E4M3_MAX);
            let q = e4m3_round(clamp(v[i] * pow2(-e), -E4M3_MAX, E4M3_MAX));
            x[base + i] = q * pow2(e);
        }
        for (var i = tail + lid; i < n; i += WG) { x[base + i] = v[i]; }
    } else if (p.qat == 2u) {
        // Hadamard (Sylvester order) over the whole row (n a power of two), scaled by 1/sqrt(n).
        for (var h = 1u; h < n; h <<= 1u) {
            for (var t = lid; t < n / 2u; t += WG) {
                let j = (t / h) * 2u * h + t % h;
                let a = v[j];
                let b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
            workgroupBarrier();
        }
        for (var i = lid; i < n; i += WG) { v[i] = v[i] * p.hscale; }
        workgroupBarrier();
        for (var i = lid; i < n; i += WG) {
            let b0 = i / 32u * 32u;
            let amax = max(block_amax(b0, min(32u, n - b0)), E2M1_MAX * 1.17549435e-38);
            let e = scale_exp(amax, E2M1_MAX);
            let q = e2m1_round(clamp(v[i] * pow2(-e), -E2M1_MAX, E2M1_MAX));
            x[base + i] = q * pow2(e);
        }
    } else {
        for (var i = lid; i < n; i += WG) { x[base + i] = v[i]; }
    }
}
