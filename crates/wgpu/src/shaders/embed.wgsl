// Embedding rows of the step's tokens, copied into every HC stream: x[t][s][i] = table[id_t][i].
// One dispatch per binding part of the table; a token whose row lies in another part is skipped.
// Rows are raw GGUF bytes read as u32 words: F32 (ty 0), F16 (ty 1), Q8_0 (ty 2, 34-byte blocks
// {f16 d; i8 q[32]}, value d * q).
struct Params {
    e: u32,          // elements per row
    n_hc: u32,       // streams
    row0: u32,       // first table row of this part
    rows: u32,       // rows in this part
    row_bytes: u32,
    ty: u32,
    w_off: u32,      // byte offset of the part's first row in its binding
    pad: u32,
}
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> tok: array<u32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

fn byte_at(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 3u) * 8u)) & 255u;
}

fn half_at(b: u32) -> f32 {
    let v = w[b >> 2u];
    return unpack_h2(select(v, v >> 16u, (b & 2u) != 0u)).x;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (t >= step.ntok || i >= p.e) { return; }
    let id = tok[t];
    if (id < p.row0 || id - p.row0 >= p.rows) { return; }
    let rb = p.w_off + (id - p.row0) * p.row_bytes;
    var v: f32;
    if (p.ty == 0u) {
        v = bitcast<f32>(w[(rb >> 2u) + i]);
    } else if (p.ty == 1u) {
        v = half_at(rb + 2u * i);
    } else {
        let bo = rb + (i >> 5u) * 34u;
        let q = i32(byte_at(bo + 2u + (i & 31u)) << 24u) >> 24u;
        v = half_at(bo) * f32(q);
    }
    let base = t * p.n_hc * p.e + i;
    for (var s = 0u; s < p.n_hc; s++) {
        x[base + s * p.e] = v;
    }
}
