// The step's new KV rows into the sliding-window ring (position q at row q % swa); with more tokens
// than swa only the last swa are stored (they overwrite the earlier ones in the CPU too). Slot s's
// ring is rows s * swa .. (s + 1) * swa; a batched step stores every row in its own slot's ring.
struct Params { d: u32, swa: u32, wg_x: u32, pad: u32 }
@group(0) @binding(0) var<storage, read> kvn: array<f32>;
@group(0) @binding(1) var<storage, read_write> ring: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x + gid.y * p.wg_x * 64u;
    let n = select(min(step.ntok, p.swa), step.ntok, step.batch != 0u);
    if (k >= n * p.d) { return; }
    let t = step.ntok - n + k / p.d;
    let i = k % p.d;
    ring[(seq_of(t).slot * p.swa + row_pos(t) % p.swa) * p.d + i] = kvn[t * p.d + i];
}
