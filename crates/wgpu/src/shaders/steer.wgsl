// Directional steering (ds4_model::steering) of one sub-layer output, before the HC exit: for each
// slot in order, y -= scale * v * dot(v, y), v the slot's direction for this layer. The output y of
// token t is the sum of its k part rows (k = 1: the attention output; k > 0 with has_extra: the MoE's
// expert slots in ascending order plus the shared expert's row, as hc_post sums them), so the edit
// goes into part row 0. One workgroup per token; a row whose flag is 0 is left as it is (its scale
// counts as 0, keeping the barriers in uniform control flow).
struct Params {
    e: u32,
    k: u32,
    has_extra: u32,
    slots: u32,
    layer: u32,     // this layer's index among the directions' layers
    n_layers: u32,
    site: u32,      // 0: FFN scales, 1: attention scales
    pad0: u32,
}
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read_write> parts: array<f32>;  // ntok x k x e
@group(0) @binding(1) var<storage, read> extra: array<f32>;        // ntok x e (shared expert)
@group(0) @binding(2) var<storage, read> dirs: array<f32>;         // slots x n_layers x e
@group(0) @binding(3) var<storage, read> ctl: array<u32>;          // scales: slots x (ffn, attn) as f32 bits; then one flag per row
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wg.x;
    if (t >= step.ntok) { return; }
    let e = p.e;
    let row0 = t * p.k * e;
    let on = f32(ctl[2u * p.slots + t] != 0u);
    for (var s = 0u; s < p.slots; s++) {
        let scale = bitcast<f32>(ctl[2u * s + p.site]) * on;
        let v0 = (s * p.n_layers + p.layer) * e;
        var acc = 0.0;
        for (var i = lid.x; i < e; i += 256u) {
            var y = 0.0;
            for (var j = 0u; j < p.k; j++) { y += parts[row0 + j * e + i]; }
            if (p.has_extra != 0u) { y += extra[t * e + i]; }
            acc += y * dirs[v0 + i];
        }
        red[lid.x] = acc;
        workgroupBarrier();
        for (var w = 128u; w > 0u; w >>= 1u) {
            if (lid.x < w) { red[lid.x] += red[lid.x + w]; }
            workgroupBarrier();
        }
        let c = scale * red[0];
        workgroupBarrier();
        if (c != 0.0) {
            for (var i = lid.x; i < e; i += 256u) { parts[row0 + i] -= c * dirs[v0 + i]; }
        }
        storageBarrier();
        workgroupBarrier();
    }
}
