@group(0) @binding(0) var<storage, read> kv_in: array<f32>;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> ape: array<f32>;
@group(0) @binding(3) var<storage, read> st_kv: array<f32>;
@group(0) @binding(4) var<storage, read> st_sc: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;
@group(0) @binding(7) var<uniform> step: Step;

// (score, value) of position q of sequence s at state channel ch.
fn cand(s: Seq, q: u32, ch: u32) -> vec2<f32> {
    let w = p.width;
    if (q >= s.pos) {
        let i = (s.row0 + q - s.pos) * w + ch;
        return vec2<f32>(gate[i] + ape[(q % p.ratio) * w + ch], kv_in[i]);
    }
    let i = (s.slot * state_rows() + state_row(q, s.pos)) * w + ch;
    return vec2<f32>(st_sc[i], st_kv[i]);
}

// Candidate k of window c at output channel j (ratio 4: k < 4 the previous window at channel j,
// absent for c = 0; k >= 4 this window at channel d + j).
fn cand_k(s: Seq, c: u32, k: u32, j: u32) -> vec2<f32> {
    if (p.ratio == 4u) {
        if (k < 4u) {
            if (c == 0u) { return vec2<f32>(NEG, 0.0); }
            return cand(s, (c - 1u) * 4u + k, j);
        }
        return cand(s, c * 4u + k - 4u, p.d + j);
    }
    return cand(s, c * p.ratio + k, j);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let j = gid.x;
    if (wid.z >= seq_count()) { return; }
    let s = seq_at(wid.z);
    let c = s.pos / p.ratio + wid.y;
    if (j >= p.d || c >= (s.pos + s.n) / p.ratio) { return; }
    let n = select(p.ratio, 8u, p.ratio == 4u);
    var m = NEG;
    for (var k = 0u; k < n; k++) { m = max(m, cand_k(s, c, k, j).x); }
    var r = 0.0;
    if (m > NEG) {
        var den = 0.0;
        var num = 0.0;
        for (var k = 0u; k < n; k++) {
            let sv = cand_k(s, c, k, j);
            if (sv.x > NEG) {
                let e = exp(sv.x - m);
                den += e;
                num += e * sv.y;
            }
        }
        r = num / den;
    }
    out[(s.slot * p.cap + c) * p.d + j] = r;
}
