@group(0) @binding(0) var<storage, read> kv_in: array<f32>;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> ape: array<f32>;
@group(0) @binding(3) var<storage, read_write> st_kv: array<f32>;
@group(0) @binding(4) var<storage, read_write> st_sc: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;
@group(0) @binding(6) var<uniform> step: Step;

// Thread ch owns state channel ch of every row (ratio 4 reads the old open-window row before
// overwriting it, so no other thread may touch the channel).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let ch = gid.x;
    let w = p.width;
    let r = p.ratio;
    if (ch >= w || step.ntok == 0u || wid.z >= seq_count()) { return; }
    let sq = seq_at(wid.z);
    // Slot base: the sequence's own frontier rows.
    let sb = sq.slot * state_rows();
    let last = sq.pos + sq.n - 1u;
    let end = sq.pos + sq.n;
    let open = select(0u, 4u, r == 4u);
    if (r == 4u && end / 4u > sq.pos / 4u) {
        // Rows 0..3: the last window closed in this step.
        let c = end / 4u - 1u;
        for (var s = 0u; s < 4u; s++) {
            let q = c * 4u + s;
            var kv: f32;
            var sc: f32;
            if (q >= sq.pos) {
                let i = (sq.row0 + q - sq.pos) * w + ch;
                kv = kv_in[i];
                sc = gate[i] + ape[s * w + ch];
            } else {
                kv = st_kv[(sb + 4u + s) * w + ch];
                sc = st_sc[(sb + 4u + s) * w + ch];
            }
            st_kv[(sb + s) * w + ch] = kv;
            st_sc[(sb + s) * w + ch] = sc;
        }
    }
    // Slot rows: the step's latest token of each slot.
    for (var s = 0u; s < r; s++) {
        let q = last - (last + r - s) % r;
        if (q >= sq.pos && q <= last) {
            let i = (sq.row0 + q - sq.pos) * w + ch;
            st_kv[(sb + open + s) * w + ch] = kv_in[i];
            st_sc[(sb + open + s) * w + ch] = gate[i] + ape[s * w + ch];
        }
    }
}
