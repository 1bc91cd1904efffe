// Subgroup reduction (adapter has SUBGROUP): subgroupAdd per subgroup, the first lane of each
// subgroup stores its sum, every other lane a zero, and thread 0 adds the 64 slots. This makes no
// assumption about how invocations map to subgroups or about the subgroup size.
// (No `enable subgroups;`: naga rejects the directive but accepts the builtins.)
fn reduce(lid: u32, lane: u32, acc: array<f32, TB>) {
    for (var t = 0u; t < TB; t++) {
        let s = subgroupAdd(acc[t]);
        red[t * WG + lid] = select(0.0, s, lane == 0u);
    }
    workgroupBarrier();
    if (lid == 0u) {
        for (var t = 0u; t < TB; t++) {
            var sum = 0.0;
            for (var i = 0u; i < WG; i++) { sum += red[t * WG + i]; }
            red[t * WG] = sum;
        }
    }
    workgroupBarrier();
}
