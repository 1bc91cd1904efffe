//! Every WGSL module the crate builds parses and validates with naga (the compiler wgpu uses), and
//! translates to MSL 2.4 and 3.0 (Metal, with and without wgpu's bounds-check policy) and SPIR-V 1.3
//! (Vulkan). Modules without subgroups must validate with no optional capability at all: they are
//! the fallback path for adapters that lack SUBGROUP.
use naga::back::{msl, spv};
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
use ds4_wgpu::shaders::ModuleSource;
use naga::valid::{Capabilities, ShaderStages, SubgroupOperationSet, ValidationFlags, Validator};

fn caps_of(m: &ModuleSource) -> Capabilities {
    let mut caps = Capabilities::empty();
    caps.set(Capabilities::SUBGROUP, m.subgroup);
    caps.set(Capabilities::SHADER_FLOAT16_IN_FLOAT32, m.f16_in_f32);
    caps.set(Capabilities::COOPERATIVE_MATRIX | Capabilities::SHADER_FLOAT16, m.coop);
    caps
}

fn validate(m: &ModuleSource) -> (naga::Module, naga::valid::ModuleInfo) {
    let (name, src, subgroup) = (&m.name, &m.wgsl, m.subgroup);
    let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{name}: WGSL parse error:\n{}", e.emit_to_string(src)));
    let mut v = Validator::new(ValidationFlags::all(), caps_of(m));
    if subgroup {
        v.subgroup_stages(ShaderStages::COMPUTE);
        v.subgroup_operations(SubgroupOperationSet::all());
    }
    let info = v.validate(&module).unwrap_or_else(|e| panic!("{name}: naga validation error:\n{}", e.emit_to_string(src)));
    (module, info)
}

#[test]
fn every_module_validates_and_translates_to_msl_and_spirv() {
    let modules = ds4_wgpu::shaders::all_modules();
    assert_eq!(modules.len(), 807, "5 types x (2 x 24 one-token shapes + 2 x 12 batched shapes + 2 tiled products + 2 x 2 coop tiled products) x 2 f16 decodes + 2 x 2 attention + 23 others");
    for m in &modules {
        let (name, subgroup) = (&m.name, &m.subgroup);
        let (module, info) = validate(m);
        for lang in [(2, 4), (3, 0)] {
            for policy in [BoundsCheckPolicy::Unchecked, BoundsCheckPolicy::Restrict] {
                let opts = msl::Options {
                    lang_version: lang,
                    bounds_check_policies: BoundsCheckPolicies { index: policy, buffer: policy, image_load: policy, binding_array: policy },
                    fake_missing_bindings: true,
                    ..Default::default()
                };
                let (text, _) = msl::write_string(&module, &info, &opts, &msl::PipelineOptions::default())
                    .unwrap_or_else(|e| panic!("{name}: MSL {lang:?} {policy:?}: {e}"));
                assert!(text.contains("kernel void"), "{name}: no kernel in the MSL");
                if *subgroup && m.wgsl.contains("subgroupAdd") {
                    assert!(text.contains("simd_sum"), "{name}: subgroupAdd did not become simd_sum");
                }
            }
        }
        let opts = spv::Options { lang_version: (1, 3), ..Default::default() };
        let words = spv::write_vec(&module, &info, &opts, None).unwrap_or_else(|e| panic!("{name}: SPIR-V: {e}"));
        assert_eq!(words.first(), Some(&0x0723_0203), "{name}: not a SPIR-V module");
        // (The SPIR-V itself is compiled and run by the Vulkan driver in the lavapipe op tests.)
    }
}

#[test]
fn feature_modules_need_their_capability() {
    // The variants that use an optional capability must not slip into the fallback set: without it
    // they fail validation (and the fallbacks pass with none: see above).
    for m in ds4_wgpu::shaders::all_modules() {
        if m.subgroup || m.f16_in_f32 || m.coop {
            let module = naga::front::wgsl::parse_str(&m.wgsl).expect("parses");
            let r = Validator::new(ValidationFlags::all(), Capabilities::empty()).validate(&module);
            assert!(r.is_err(), "{} validated without its capability", m.name);
        }
    }
}
